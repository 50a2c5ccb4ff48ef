//! Integration tests of the surface.
