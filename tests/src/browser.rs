//! A real browser for the tests of what a person looks at: Debian's
//! Chromium, headless, with a profile of its own, driven by Debian's
//! chromedriver over the W3C WebDriver protocol (JSON over HTTP on
//! loopback). `scripts/ensure-chromium.sh` installs both; `scripts/test`
//! runs it.
//!
//! The few calls used (a session, a page, a script, a screenshot) are
//! spoken here over the harness's HTTP client rather than through a
//! WebDriver crate: fantoccini, the maintained one, needs Mozilla's
//! `webdriver` crate, whose MPL-2.0 licence deny.toml does not take, and
//! some twenty crates more.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::host::free_port;

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A headless Chromium with one page, closed when dropped.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    _profile: tempfile::TempDir,
}

/// Why the browser tests cannot run here, when they cannot: the test says
/// so and does not run (a machine without Debian's Chromium).
pub fn missing() -> Option<String> {
    [CHROMIUM, CHROMEDRIVER]
        .iter()
        .find(|path| !Path::new(path).exists())
        .map(|path| format!("{path} is not installed (scripts/ensure-chromium.sh installs it)"))
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless session.
    pub fn start() -> Result<Self> {
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {CHROMEDRIVER}"))?;
        let agent = ureq::Agent::config_builder()
            .proxy(None)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .new_agent();
        let base = format!("http://127.0.0.1:{port}");
        let profile = tempfile::tempdir()?;
        let mut browser = Self {
            driver,
            base,
            session: String::new(),
            agent,
            _profile: profile,
        };
        browser.wait_for_driver()?;
        let profile = browser._profile.path().display().to_string();
        // Headless and quiet: nothing of the machine's network is asked for
        // (the build machines refuse it, many connections at a time).
        let args = [
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--window-size=1280,1000".into(),
            format!("--user-data-dir={profile}"),
        ];
        let created = browser.call(
            "POST",
            "/session",
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
            }}})),
        )?;
        browser.session = created["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("no session id in {created}"))?
            .to_string();
        Ok(browser)
    }

    fn wait_for_driver(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(status) = self.call("GET", "/status", None)
                && status["ready"] == true
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("chromedriver did not answer within 20 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One WebDriver command: its `value`, or the driver's error.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut response = match (method, body) {
            ("GET", _) => self.agent.get(&url).call()?,
            ("DELETE", _) => self.agent.delete(&url).call()?,
            (_, body) => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(body.unwrap_or_else(|| json!({})).to_string())?,
        };
        let status = response.status().as_u16();
        let answer: Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
        if status != 200 {
            bail!("WebDriver {method} {path}: {status}: {}", answer["value"]);
        }
        Ok(answer["value"].clone())
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Loads `url` in the page.
    pub fn goto(&self, url: &str) -> Result<()> {
        self.call(
            "POST",
            &self.session_path("/url"),
            Some(json!({"url": url})),
        )?;
        Ok(())
    }

    /// Runs `script` (a function body; `arguments[i]` are `args`) in the
    /// page and returns what it returned.
    pub fn script(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        self.call(
            "POST",
            &self.session_path("/execute/sync"),
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Polls `script` until it returns something other than `null` or
    /// `false`, for up to `within`.
    pub fn wait_for(&self, script: &str, within: Duration) -> Result<Value> {
        let deadline = Instant::now() + within;
        loop {
            let value = self.script(script, vec![])?;
            if !(value.is_null() || value == false) {
                return Ok(value);
            }
            if Instant::now() > deadline {
                bail!("the page did not show it within {within:?}: {script}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Saves a PNG of the page's window at `path`.
    pub fn screenshot(&self, path: &Path) -> Result<()> {
        let encoded = self.call("GET", &self.session_path("/screenshot"), None)?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().ok_or_else(|| anyhow!("no screenshot"))?)?;
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder)?;
        }
        std::fs::write(path, png)?;
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &self.session_path(""), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
