//! The web console in a real browser: headless Chromium driven through
//! WebDriver (Debian's `chromium` and `chromium-driver`; the test starts
//! `chromedriver` itself on a free port), against `baton serve` over a
//! SQLite store in which `baton demo --pause` left a waiting tree.
//!
//! Nothing here downloads a driver or a browser: without
//! `/usr/bin/chromedriver` (or `BATON_CHROMEDRIVER`) the tests fail and
//! say how to install it.
#![allow(missing_docs)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::Value;

/// The demo scope's token.
const TOKEN: &str = "console-token-of-demo-0123";
/// A token of another scope.
const OTHER: &str = "console-token-of-other-0123";

/// The longest any one expected page state may take (a loaded 2-core
/// machine builds and runs four browsers at once).
const PATIENCE: Duration = Duration::from_secs(90);

/// A child process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines of a child's pipe, read on a thread.
fn lines(pipe: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

/// The next line `wanted` accepts, within the patience.
fn line_matching(
    lines: &std::sync::mpsc::Receiver<String>,
    what: &str,
    wanted: impl Fn(&str) -> bool,
) -> String {
    loop {
        match lines.recv_timeout(PATIENCE) {
            Ok(line) if wanted(&line) => return line,
            Ok(_) => {}
            Err(error) => panic!("{what}: no such line in time ({error})"),
        }
    }
}

/// A store directory with a tokens file, a `baton serve` on it, and the
/// `baton` binary to run other commands against the same store.
struct Host {
    dir: tempfile::TempDir,
    base: String,
    _serve: Killed,
}

impl Host {
    fn baton(dir: &Path, args: &[&str]) -> String {
        let output = Command::new(env!("CARGO_BIN_EXE_baton"))
            .current_dir(dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("the binary runs");
        assert!(
            output.status.success(),
            "baton {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8")
    }

    /// `baton demo --pause --json`: a waiting tree and its open wait.
    fn pause(dir: &Path) -> (String, String) {
        let paused: Value =
            serde_json::from_str(Host::baton(dir, &["demo", "--pause", "--json"]).trim())
                .expect("json");
        (
            paused["tree"].as_str().expect("tree").to_owned(),
            paused["wait"].as_str().expect("wait").to_owned(),
        )
    }

    /// A store with `paused` waiting demo trees, served by `baton serve`.
    fn start(paused: usize) -> (Host, Vec<(String, String)>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let trees = (0..paused).map(|_| Host::pause(dir.path())).collect();
        std::fs::write(
            dir.path().join("tokens.txt"),
            format!("demo {TOKEN}\nother {OTHER}\n"),
        )
        .expect("writes the tokens file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
            .current_dir(dir.path())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--tokens",
                "tokens.txt",
                "--grace",
                "5s",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve starts");
        let stderr = lines(child.stderr.take().expect("stderr"));
        let serve = Killed(child);
        let listening = line_matching(&stderr, "serve's address", |line| {
            line.starts_with("serving the HTTP API on ")
        });
        let base = listening["serving the HTTP API on ".len()..]
            .split_whitespace()
            .next()
            .expect("an address")
            .to_owned();
        line_matching(&stderr, "serve's readiness", |line| {
            line.starts_with("ready:")
        });
        // Keep draining serve's stderr so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in stderr.iter() {});
        (
            Host {
                dir,
                base,
                _serve: serve,
            },
            trees,
        )
    }

    /// How many records the store holds for `tree` (read by another
    /// process, from the store itself).
    fn log_len(&self, tree: &str) -> usize {
        Host::baton(self.dir.path(), &["log", tree, "--json"])
            .lines()
            .count()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// `chromedriver` on a free port, and a headless Chromium session on it.
struct Browser {
    client: Client,
    _driver: Killed,
}

fn chromedriver_path() -> PathBuf {
    let path = std::env::var_os("BATON_CHROMEDRIVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromedriver"));
    assert!(
        path.exists(),
        "chromedriver is missing at {}: the console's browser tests need Debian's Chromium and its driver; \
         install them with `apt-get update && apt-get install -y chromium chromium-driver` \
         (.ci/run does this on CI), or point BATON_CHROMEDRIVER at a chromedriver",
        path.display()
    );
    path
}

impl Browser {
    async fn open() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new(chromedriver_path())
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let stdout = lines(child.stdout.take().expect("stdout"));
        let driver = Killed(child);
        let started = tokio::task::spawn_blocking(move || {
            let line = line_matching(&stdout, "chromedriver's start", |line| {
                line.contains("started successfully")
            });
            std::thread::spawn(move || for _ in stdout.iter() {});
            line
        })
        .await
        .expect("joins");
        assert!(started.contains(&port.to_string()), "{started}");
        let mut options = serde_json::json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1800", "--disable-extensions", "--no-first-run"],
        });
        let binary = Path::new("/usr/lib/chromium/chromium");
        if binary.exists() {
            options["binary"] = Value::from(binary.display().to_string());
        }
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".to_owned(), options);
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session");
        Browser {
            client,
            _driver: driver,
        }
    }

    /// The element `css` once it is on the page, within the patience.
    async fn element(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|error| panic!("no `{css}` on the page in time: {error}"))
    }

    /// The text of the element `xpath` names, once it is on the page (an
    /// XPath can wait for a text).
    async fn text_where(&self, xpath: &str) -> String {
        self.client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::XPath(xpath))
            .await
            .unwrap_or_else(|error| panic!("no `{xpath}` on the page in time: {error}"))
            .text()
            .await
            .expect("text")
    }

    async fn text(&self, css: &str) -> String {
        self.element(css).await.text().await.expect("text")
    }

    /// Signs in with `token` through the sign-in form.
    async fn sign_in(&self, host: &Host, token: &str) {
        self.client.goto(&host.url("/login")).await.expect("goto");
        self.element("#token")
            .await
            .send_keys(token)
            .await
            .expect("types");
        self.element("form.card button[type=submit]")
            .await
            .click()
            .await
            .expect("clicks");
    }

    /// Presses keys one after another (down, then up), as a person would.
    async fn keys(&self, keys: &[char]) {
        let mut actions = KeyActions::new("keyboard".to_owned());
        for key in keys {
            actions = actions
                .then(KeyAction::Down { value: *key })
                .then(KeyAction::Up { value: *key });
        }
        self.client
            .perform_actions(actions)
            .await
            .expect("key actions");
    }

    /// Presses Tab until the focused element matches `css` (at most 60
    /// times), as a keyboard user reaches a control.
    async fn tab_to(&self, css: &str) {
        let script = format!(
            "return document.activeElement !== null && document.activeElement.matches({});",
            serde_json::to_string(css).expect("json")
        );
        for _ in 0..60 {
            self.keys(&[Key::Tab.into()]).await;
            let focused = self.client.execute(&script, vec![]).await.expect("script");
            if focused == Value::Bool(true) {
                return;
            }
        }
        panic!("Tab never reached `{css}`");
    }

    async fn close(self) {
        self.client.close().await.expect("the session closes");
    }
}

/// Where the screenshot goes: the workspace's target directory.
fn screenshot_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("console-screenshots")
}

/// An API call with the bearer token.
async fn api(host: &Host, method: reqwest::Method, path: &str, body: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, host.url(path))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.expect("the host answers");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_paused_demo_is_answered_through_the_generated_form_and_the_page_reaches_done_live() {
    let (host, trees) = Host::start(2);
    let (first, _) = &trees[0];
    let (second, second_wait) = &trees[1];
    let browser = Browser::open().await;
    browser.sign_in(&host, TOKEN).await;

    // The list shows both waiting trees, waiting first, with their program.
    let row = browser
        .element(&format!(
            "#trees tr[data-status=waiting] a[href='/trees/{first}']"
        ))
        .await;
    let listed = browser.text("#trees tbody").await;
    assert!(
        listed.contains("demo.pause") && listed.contains(second),
        "{listed}"
    );
    row.click().await.expect("opens the tree");

    // The tree page: waiting, the question, a form generated from the
    // wait's answer schema.
    assert_eq!(browser.text("#tree-status").await, "waiting");
    let page = browser.text("main").await;
    assert!(page.contains("What should the team deploy?"), "{page}");
    assert!(page.contains("demo.pause"), "{page}");
    let before = host.log_len(first);
    assert_eq!(
        browser
            .client
            .find_all(Locator::Css("#log-rows tr"))
            .await
            .expect("rows")
            .len(),
        before
    );
    browser
        .element("form.answer input[name=v]")
        .await
        .send_keys("ship it from the browser")
        .await
        .expect("types");
    browser
        .element("form.answer button[type=submit]")
        .await
        .click()
        .await
        .expect("submits");
    browser.element("#tree-status.status-done").await;
    let page = browser.text("main").await;
    assert!(page.contains("Answer recorded."), "{page}");
    assert!(
        page.contains("release 1.4: done as instructed (ship it from the browser)"),
        "{page}"
    );
    assert!(host.log_len(first) > before);

    // Verify reports the chain's state.
    browser
        .element("#verify-button")
        .await
        .click()
        .await
        .expect("verifies");
    let verified = browser.text("#verify-result").await;
    assert!(
        verified.starts_with("Log verified: records 1–"),
        "{verified}"
    );
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    let png = browser.client.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(dir.join("tree.png"), png).expect("writes the screenshot");

    // The second tree's page follows the tree without a reload: it is
    // answered behind the page's back, through the API, and the page
    // shows the new status and log rows (the marker set on the window
    // would be gone after a reload).
    browser
        .client
        .goto(&host.url(&format!("/trees/{second}")))
        .await
        .expect("goto");
    assert_eq!(browser.text("#tree-status").await, "waiting");
    let rows_before = browser
        .client
        .find_all(Locator::Css("#log-rows tr"))
        .await
        .expect("rows")
        .len();
    browser
        .client
        .execute("window.stillTheSamePage = true; return true;", vec![])
        .await
        .expect("marks the page");
    let (status, _) = api(
        &host,
        reqwest::Method::POST,
        &format!("/v1/trees/{second}/waits/{second_wait}"),
        Some(r#""shipped behind the page's back""#),
    )
    .await;
    assert_eq!(status, 200);
    browser.element("#tree-status.status-done").await;
    let marker = browser
        .client
        .execute("return window.stillTheSamePage === true;", vec![])
        .await
        .expect("reads the marker");
    assert_eq!(marker, Value::Bool(true), "the page was reloaded");
    browser
        .element(&format!(
            "#log-rows tr[data-seq='{}']",
            host.log_len(second)
        ))
        .await;
    assert!(
        browser
            .client
            .find_all(Locator::Css("#log-rows tr"))
            .await
            .expect("rows")
            .len()
            > rows_before
    );
    assert!(
        browser
            .client
            .find_all(Locator::Css("form.answer"))
            .await
            .expect("forms")
            .is_empty(),
        "the answered wait's form is gone"
    );
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_answer_shows_the_schema_error_and_writes_nothing_and_a_stale_form_is_refused() {
    let (host, trees) = Host::start(1);
    let (tree, wait) = &trees[0];
    let browser = Browser::open().await;
    browser.sign_in(&host, TOKEN).await;
    browser.element("#trees").await;
    browser
        .client
        .goto(&host.url(&format!("/trees/{tree}")))
        .await
        .expect("goto");
    let before = host.log_len(tree);

    // Not JSON at all: the page refuses to send it and says why.
    browser
        .element("details.json-answer summary")
        .await
        .click()
        .await
        .expect("opens");
    let json = browser
        .element("details.json-answer textarea[name=json]")
        .await;
    json.send_keys("{not json").await.expect("types");
    browser
        .element("details.json-answer button[type=submit]")
        .await
        .click()
        .await
        .expect("submits");
    let error = browser.text(&format!("#answer-{wait}-json-error")).await;
    assert!(error.starts_with("Not JSON"), "{error}");
    assert_eq!(host.log_len(tree), before);

    // JSON that the wait's schema refuses (a number where a string is
    // asked): the server says so beside the form and writes nothing.
    json.clear().await.expect("clears");
    json.send_keys("42").await.expect("types");
    browser
        .element("details.json-answer button[type=submit]")
        .await
        .click()
        .await
        .expect("submits");
    let error = browser
        .text_where(&format!(
            "//*[@id='answer-{wait}-json-error'][contains(., 'does not fit')]"
        ))
        .await;
    assert!(error.contains("Nothing was written"), "{error}");
    assert_eq!(browser.text("#tree-status").await, "waiting");
    assert_eq!(host.log_len(tree), before, "a refused answer wrote nothing");

    // A stale page: a copy of the answer form is kept (as another tab
    // would keep it), the tree finishes elsewhere, then the copy is sent.
    // The page says the wait is closed, and nothing more is written.
    browser
        .client
        .execute(
            "window.staleForm = document.querySelector('form.answer').cloneNode(true); return true;",
            vec![],
        )
        .await
        .expect("keeps a copy of the form");
    let (status, _) = api(
        &host,
        reqwest::Method::POST,
        &format!("/v1/trees/{tree}/waits/{wait}?until=terminal&timeout_ms=60000"),
        Some(r#""answered elsewhere""#),
    )
    .await;
    assert_eq!(status, 200);
    let finished = host.log_len(tree);
    browser
        .client
        .execute(
            "const form = window.staleForm; document.body.appendChild(form); \
             form.querySelector('input[name=v]').value = 'too late'; form.submit(); return true;",
            vec![],
        )
        .await
        .expect("submits the stale form");
    let banner = browser.text("#banner").await;
    assert!(
        banner.contains("no longer open") && banner.contains("nothing was written"),
        "{banner}"
    );
    assert_eq!(host.log_len(tree), finished);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_another_scope_sees_no_trees_and_a_wrong_token_is_refused() {
    let (host, trees) = Host::start(1);
    let (tree, _) = &trees[0];
    let browser = Browser::open().await;

    browser.sign_in(&host, "not-a-token-of-this-host").await;
    let error = browser.text("#login-error").await;
    assert!(error.contains("not one this host knows"), "{error}");

    browser.sign_in(&host, OTHER).await;
    let empty = browser.text("#no-trees").await;
    assert!(empty.contains("other"), "{empty}");
    assert!(
        browser
            .client
            .find_all(Locator::Css("#trees"))
            .await
            .expect("find")
            .is_empty()
    );
    // The demo scope's tree reads as missing, exactly as in the API.
    browser
        .client
        .goto(&host.url(&format!("/trees/{tree}")))
        .await
        .expect("goto");
    let page = browser.text("main").await;
    assert!(page.contains("There is no tree"), "{page}");
    // The event stream, with this cookie, refuses the tree too.
    let status = browser
        .client
        .execute_async(
            &format!(
                "const done = arguments[0]; fetch('/v1/trees/{tree}/events').then(r => done(r.status));"
            ),
            vec![],
        )
        .await
        .expect("fetches");
    assert_eq!(status, Value::from(404));
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_flow_works_by_keyboard_alone() {
    let (host, trees) = Host::start(1);
    let (tree, _) = &trees[0];
    let browser = Browser::open().await;
    browser.client.goto(&host.url("/")).await.expect("goto");

    // Sign in: the token field has the focus; type and press Enter.
    browser.element("#token").await;
    let mut keys: Vec<char> = TOKEN.chars().collect();
    keys.push(Key::Enter.into());
    browser.keys(&keys).await;
    browser.element("#trees").await;

    // To the waiting tree's link, then Enter.
    browser.tab_to(&format!("a[href='/trees/{tree}']")).await;
    browser.keys(&[Key::Enter.into()]).await;
    browser.element("#tree-status.status-waiting").await;

    // To the answer field, type, to the send button, Enter.
    browser.tab_to("form.answer input[name=v]").await;
    let keys: Vec<char> = "typed answer".chars().collect();
    browser.keys(&keys).await;
    browser.tab_to("form.answer button[type=submit]").await;
    browser.keys(&[Key::Enter.into()]).await;
    browser.element("#tree-status.status-done").await;
    let page = browser.text("main").await;
    assert!(
        page.contains("release 1.4: done as instructed (typed answer)"),
        "{page}"
    );
    browser.close().await;
}
