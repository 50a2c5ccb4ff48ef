//! Test support for the end-to-end suite (shared helpers live here as the suite grows).
