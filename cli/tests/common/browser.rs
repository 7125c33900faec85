//! A real headless Chromium driven over the W3C WebDriver protocol by Debian's `chromedriver`
//! (`./scripts/test.sh` installs `chromium` and `chromium-driver` when missing): open a page,
//! type, click, run a script, take a screenshot.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one browser session in it; both end when dropped.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with the flags this machine needs (no
    /// sandbox as root, no GPU, no network beyond loopback), `width` x `height` pixels.
    pub fn start(width: u32, height: u32) -> Browser {
        let port = super::free_port();
        // Its output goes nowhere: a pipe nobody reads would kill it at its second line.
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver not found: ./scripts/test.sh installs Debian's chromium-driver");
        let base = format!("http://127.0.0.1:{port}");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let until = Instant::now() + Duration::from_secs(20);
        while agent.get(format!("{base}/status")).call().is_err() {
            assert!(
                Instant::now() < until,
                "chromedriver did not answer on {base}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().unwrap();
        let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("chromium not found: ./scripts/test.sh installs Debian's chromium");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": binary,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--disable-dev-shm-usage",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            agent,
            _profile: profile,
        };
        let reply = browser.call("POST", "/session", Some(capabilities));
        browser.session = reply["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {reply}"))
            .to_owned();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let mut response = match method {
            "GET" => self.agent.get(&url).call(),
            "DELETE" => self.agent.delete(&url).call(),
            _ => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(body.unwrap_or_else(|| json!({})).to_string().as_bytes()),
        }
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let text = response.body_mut().read_to_string().unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if let Some(error) = v["value"].get("error") {
            panic!("{method} {path}: {error}: {}", v["value"]["message"]);
        }
        v.get("value").cloned().unwrap_or(v)
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        self.call(method, &path, body)
    }

    /// Loads `url` and waits for it.
    pub fn open(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })));
    }

    /// The first element matching a CSS selector.
    pub fn find(&self, css: &str) -> String {
        let v = self.session_call(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_owned()
    }

    pub fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.session_call(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    pub fn click(&self, css: &str) {
        let id = self.find(css);
        self.session_call("POST", &format!("/element/{id}/click"), None);
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub fn script(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// The page's visible text.
    pub fn text(&self) -> String {
        self.script("return document.body.innerText;")
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// Waits (up to 20 s) until the page's text holds `needle` (`present`) or no longer does:
    /// a click on a form's button returns before the next page has loaded.
    pub fn wait_for_text(&self, needle: &str, present: bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while self.text().contains(needle) != present {
            assert!(
                Instant::now() < until,
                "the page still {} `{needle}`:\n{}",
                if present { "lacks" } else { "shows" },
                self.text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Saves a PNG of the page as laid out at the window's size.
    pub fn screenshot(&self, path: &Path) {
        use base64::Engine as _;
        let v = self.session_call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("base64 PNG"))
            .unwrap();
        assert_eq!(&png[1..4], b"PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }

    /// Makes the window as tall as the page, so a screenshot holds all of it.
    pub fn fit_height(&self, width: u32) {
        // Shrink first: a page is never shorter than the window it is measured in.
        self.session_call(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": 400})),
        );
        let h = self
            .script("return Math.ceil(document.documentElement.scrollHeight);")
            .as_u64()
            .unwrap_or(1000)
            .clamp(400, 8000);
        self.session_call(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": h + 120})),
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self
                .agent
                .delete(format!("{}/session/{}", self.base, self.session))
                .call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Where a test keeps its screenshots: `$GPULEDGER_SCREENSHOTS` when set (the README's
/// `scripts/screenshots.sh` points it at `dashboards/screenshots/`), else the test's target
/// temporary directory.
pub fn screenshot_dir() -> std::path::PathBuf {
    std::env::var_os("GPULEDGER_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots"))
}
