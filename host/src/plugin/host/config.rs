//! `config` of `acemq:plugin/host`: the consumer's `[consumers.config]`
//! table, read-only, the same for every call.

use std::sync::Arc;

use super::super::engine::CompiledPlugin;
use super::super::{ConsumerContext, PluginError};
use super::HostInterface;

/// One instance's view of its consumer's table.
pub struct Config {
    context: Arc<ConsumerContext>,
}

impl HostInterface for Config {
    fn prepare(context: &Arc<ConsumerContext>, _plugin: &Arc<str>) -> Self {
        Self {
            context: context.clone(),
        }
    }

    /// Warns of each `[consumers.config]` key the plugin does not declare
    /// it reads (when it declares any): usually a typo, which would leave
    /// the plugin on its default without a word. Never refuses: a key the
    /// plugin does not read harms nothing.
    fn check_config(plugin: &CompiledPlugin, context: &ConsumerContext) -> Result<(), PluginError> {
        let Some(declared) = &plugin.config_keys else {
            return Ok(());
        };
        for key in super::super::config_keys::unknown(declared, context.config.keys()) {
            tracing::warn!(
                queue = %context.queue,
                plugin = %plugin.path.display(),
                key,
                declared = %declared.join(", "),
                "[consumers.config] key '{key}' is not one this plugin reads; it reads: {}",
                declared.join(", ")
            );
        }
        Ok(())
    }
}

impl Config {
    /// The value of `key`, if the consumer set it.
    pub fn get(&self, key: &str) -> Option<String> {
        self.context.config.get(key).cloned()
    }
}
