//! The host config of the stream benches' scene: one stream, read from
//! `first` by a named consumer with a plugin.

use crate::host::plugin_path;

/// A config that declares `stream` and reads it from `first` as the named
/// consumer `consumer_name` with `plugin` (a plugin of `plugins/`), its
/// position kept by `checkpoint`; more lines of `[broker]` or of the
/// consumer where a bench needs them.
pub struct StreamReaderConfig<'a> {
    /// The broker's AMQP URL.
    pub url: &'a str,
    pub stream: &'a str,
    pub plugin: &'a str,
    pub consumer_name: &'a str,
    pub checkpoint: &'a str,
    /// Lines added to `[broker]`, each ending in a newline.
    pub broker_lines: String,
    /// Lines added to the `[[consumers]]` entry, each ending in a newline.
    pub consumer_lines: String,
}

impl<'a> StreamReaderConfig<'a> {
    /// The scene with the `echo` plugin and no added lines.
    #[must_use]
    pub fn echo(
        url: &'a str,
        stream: &'a str,
        consumer_name: &'a str,
        checkpoint: &'a str,
    ) -> Self {
        Self {
            url,
            stream,
            plugin: "echo",
            consumer_name,
            checkpoint,
            broker_lines: String::new(),
            consumer_lines: String::new(),
        }
    }

    /// The config file's text.
    #[must_use]
    pub fn toml(&self) -> String {
        format!(
            r#"
[broker]
url = "{url}"
{broker_lines}
[[queues]]
name = "{stream}"
type = "stream"

[[consumers]]
queue = "{stream}"
plugin = "{plugin}"
offset = "first"
consumer_name = "{name}"
checkpoint = "{checkpoint}"
{consumer_lines}"#,
            url = self.url,
            broker_lines = self.broker_lines,
            stream = self.stream,
            plugin = plugin_path(self.plugin).display(),
            name = self.consumer_name,
            checkpoint = self.checkpoint,
            consumer_lines = self.consumer_lines,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scene_parses_as_a_host_config_with_its_added_lines() {
        let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
        let mut config = StreamReaderConfig::echo(url, "bench.s", "reader-1", "broker");
        config.broker_lines = "stream_port = 5552\n".into();
        config.consumer_lines = "stream_protocol = \"stream\"\nprefetch = 20\n".into();
        let loaded = acemq_host::config::LoadedConfig::parse(
            std::path::Path::new("scene.toml"),
            config.toml(),
        )
        .expect("a valid config");
        let consumer = &loaded.config.consumers[0];
        assert_eq!(consumer.queue.get_ref(), "bench.s");
        assert_eq!(consumer.consumer_name.as_deref(), Some("reader-1"));
        assert_eq!(consumer.prefetch, Some(20));
        assert_eq!(loaded.config.broker.stream_port, Some(5552));
    }
}
