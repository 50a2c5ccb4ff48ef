//! The semantic retriever of `tool_search`: all-MiniLM-L6-v2 from `[search] model_dir`,
//! loaded in the background, fused into the lexical index; without a model (or with one that
//! cannot be loaded) the search stays lexical and says why.

use std::{path::Path, sync::Arc};

use quiver_embed_candle::MiniLm;
use quiver_registry::store::DefinitionStore;
use quiver_surface::search::HybridConfig;

use crate::{App, Config};

/// What `tool_search` ranks with, for `quiver status`.
#[derive(Debug)]
pub enum SearchMode {
    /// Lexical only: no model configured.
    Lexical,
    /// Lexical only: the configured model could not be loaded.
    Broken(String),
    /// The model is fused in.
    Semantic {
        /// The model's identity.
        model: String,
    },
}

impl std::fmt::Display for SearchMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SearchMode::Lexical => write!(
                f,
                "lexical (no [search] model_dir; `quiver model install` puts all-MiniLM-L6-v2 in place)"
            ),
            SearchMode::Broken(why) => write!(f, "lexical (the model cannot be used: {why})"),
            SearchMode::Semantic { model } => write!(f, "semantic ({model}) fused with lexical"),
        }
    }
}

/// Loads the model of `dir` (a few hundred milliseconds; off the async runtime).
pub async fn load_model(dir: &Path) -> Result<MiniLm, String> {
    let dir = dir.to_owned();
    match tokio::task::spawn_blocking(move || MiniLm::load(&dir)).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(format!("loading the model stopped: {e}")),
    }
}

/// What `config` makes `tool_search` rank with, checked by loading the model.
pub async fn search_mode(config: &Config) -> SearchMode {
    let Some(dir) = &config.search.model_dir else {
        return SearchMode::Lexical;
    };
    match load_model(dir).await {
        Ok(m) => SearchMode::Semantic {
            model: format!(
                "{} from {}",
                quiver_surface::search::Embedder::model_id(&m),
                dir.display()
            ),
        },
        Err(why) => SearchMode::Broken(why),
    }
}

impl App {
    /// With `[search] model_dir`, loads the model in the background and then fuses it into
    /// `tool_search`, with the task that gives every tool its vector (stored vectors reused
    /// from the store). Meanwhile, and for good when the model cannot be loaded (logged as a
    /// warning naming the cause), the search is lexical. The handle ends once the model is
    /// in place (true) or refused (false); `None` without a configured model.
    pub fn start_retriever(&self, config: &Config) -> Option<tokio::task::JoinHandle<bool>> {
        let dir = config.search.model_dir.clone()?;
        let surface = self.surface.clone();
        let store: Arc<dyn DefinitionStore> = self.store.clone();
        Some(tokio::spawn(async move {
            let started = std::time::Instant::now();
            match load_model(&dir).await {
                Ok(model) => {
                    tracing::info!(
                        model = %quiver_surface::search::Embedder::model_id(&model),
                        seconds = started.elapsed().as_secs_f64(),
                        "tool_search: semantic retriever loaded"
                    );
                    surface.set_vector_retriever(Some((Arc::new(model), HybridConfig::default())));
                    // Runs for the surface's life.
                    drop(surface.spawn_vector_worker(Some(store)));
                    true
                }
                Err(why) => {
                    tracing::warn!(
                        "tool_search stays lexical: [search] model_dir {}: {why}",
                        dir.display()
                    );
                    false
                }
            }
        }))
    }
}
