//! The web console over loopback without a browser: sign-in and its
//! cookie, CSRF checks on forms and on cookie-authenticated API posts, the
//! generated answer form, refusals that write nothing, and the embedded
//! assets. (The browser tests are `baton-cli`'s `tests/console.rs`.)

use reqwest::redirect::Policy;

use crate::support::{Running, TOKEN_A, TOKEN_B, open_wait};

const PAUSE: &str = r#"{"program":"demo.pause","id":"c1","input":"release 1.4"}"#;

/// A client that shows redirects instead of following them.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

fn cookie(token: &str) -> String {
    format!("baton_token={token}")
}

/// The value of the first `name="csrf"` field of a page.
fn csrf_of(page: &str) -> String {
    let at =
        page.find(r#"name="csrf" value=""#).expect("a csrf field") + r#"name="csrf" value=""#.len();
    page[at..].split('"').next().unwrap().to_owned()
}

async fn page(server: &Running, path: &str, token: &str) -> (u16, String) {
    let response = client()
        .get(format!("{}{path}", server.base))
        .header("cookie", cookie(token))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn post_form(
    server: &Running,
    path: &str,
    token: &str,
    form: &[(&str, &str)],
) -> (u16, Option<String>, String) {
    let response = client()
        .post(format!("{}{path}", server.base))
        .header("cookie", cookie(token))
        .form(form)
        .send()
        .await
        .unwrap();
    let location = response
        .headers()
        .get("location")
        .map(|value| value.to_str().unwrap().to_owned());
    (
        response.status().as_u16(),
        location,
        response.text().await.unwrap(),
    )
}

async fn head_seq(server: &Running, tree: &str) -> u64 {
    server.get(&format!("/v1/trees/{tree}"), TOKEN_A).await.json["head_seq"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_sets_an_http_only_strict_cookie_and_a_wrong_token_or_nonce_is_refused() {
    let server = Running::memory().await;
    let http = client();
    let unsigned = http.get(format!("{}/", server.base)).send().await.unwrap();
    assert_eq!(unsigned.status().as_u16(), 303);
    assert_eq!(unsigned.headers()["location"], "/login");

    let login = http
        .get(format!("{}/login", server.base))
        .send()
        .await
        .unwrap();
    let set = login.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let nonce_cookie = set.split(';').next().unwrap().to_owned();
    let form = login.text().await.unwrap();
    assert!(
        form.contains(r#"<label for="token">API token</label>"#),
        "{form}"
    );
    let nonce = csrf_of(&form);

    let sign_in = |token: &'static str, nonce: String, cookie: String| {
        let http = http.clone();
        let base = server.base.clone();
        async move {
            http.post(format!("{base}/login"))
                .header("cookie", cookie)
                .form(&[("token", token), ("csrf", nonce.as_str())])
                .send()
                .await
                .unwrap()
        }
    };
    let wrong = sign_in(
        "not-a-token-of-this-host",
        nonce.clone(),
        nonce_cookie.clone(),
    )
    .await;
    assert_eq!(wrong.status().as_u16(), 401);
    assert!(
        wrong
            .text()
            .await
            .unwrap()
            .contains("not one this host knows")
    );
    let forged = sign_in(TOKEN_A, "00".repeat(32), nonce_cookie.clone()).await;
    assert_eq!(forged.status().as_u16(), 403);
    assert!(
        forged
            .headers()
            .get_all("set-cookie")
            .iter()
            .all(|c| !c.to_str().unwrap().starts_with("baton_token="))
    );

    let signed = sign_in(TOKEN_A, nonce, nonce_cookie).await;
    assert_eq!(signed.status().as_u16(), 303);
    let cookies: Vec<String> = signed
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap().to_owned())
        .collect();
    let token = cookies
        .iter()
        .find(|c| c.starts_with("baton_token="))
        .unwrap();
    assert_eq!(
        token,
        &format!("baton_token={TOKEN_A}; Path=/; HttpOnly; SameSite=Strict")
    );

    // The list of scope a: empty, and its page is signed-in.
    let (status, list) = page(&server, "/", TOKEN_A).await;
    assert_eq!(status, 200);
    assert!(list.contains(r#"id="no-trees""#), "{list}");
    // A cookie with a token this host does not know goes back to sign-in.
    let (status, _) = page(&server, "/", "a-token-that-is-unknown-here").await;
    assert_eq!(status, 303);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_accepts_the_cookie_and_a_cookie_post_needs_the_pages_csrf_token() {
    let server = Running::memory().await;
    let http = client();
    let listed = http
        .get(format!("{}/v1/trees", server.base))
        .header("cookie", cookie(TOKEN_A))
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status().as_u16(), 200);
    let post = |csrf: Option<String>| {
        let mut request = http
            .post(format!("{}/v1/trees", server.base))
            .header("cookie", cookie(TOKEN_A))
            .header("content-type", "application/json")
            .body(PAUSE);
        if let Some(csrf) = csrf {
            request = request.header("x-baton-csrf", csrf);
        }
        request.send()
    };
    let refused = post(None).await.unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    assert!(refused.text().await.unwrap().contains("serve.auth.csrf"));
    assert!(
        server.get("/v1/trees", TOKEN_A).await.json["trees"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let (_, list) = page(&server, "/", TOKEN_A).await;
    let started = post(Some(csrf_of(&list))).await.unwrap();
    assert_eq!(started.status().as_u16(), 201);
    // The CSRF token of another token's page is refused.
    let (_, other) = page(&server, "/", TOKEN_B).await;
    assert_eq!(
        post(Some(csrf_of(&other))).await.unwrap().status().as_u16(),
        403
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_form_answers_and_every_refusal_is_in_the_page_and_writes_nothing() {
    let server = Running::memory().await;
    let started = server
        .post(
            "/v1/trees?until=wait_opened&timeout_ms=20000",
            TOKEN_A,
            PAUSE,
        )
        .await;
    let tree = started.json["tree"].as_str().unwrap().to_owned();
    let wait = open_wait(&started.json["view"]);
    let path = format!("/trees/{tree}/waits/{wait}");

    let (status, tree_page) = page(&server, &format!("/trees/{tree}"), TOKEN_A).await;
    assert_eq!(status, 200);
    assert!(
        tree_page.contains("What should the team deploy?"),
        "the wait's question"
    );
    assert!(
        tree_page.contains(&format!(r#"<label for="answer-{wait}-v">Answer</label>"#)),
        "{tree_page}"
    );
    let csrf = csrf_of(&tree_page);
    let before = head_seq(&server, &tree).await;

    // No CSRF token, or another's: refused, nothing written.
    let (status, _, text) = post_form(&server, &path, TOKEN_A, &[("v", "ship it")]).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("out of date"));
    // Another scope's token: the tree reads as missing.
    let (_, other) = page(&server, "/", TOKEN_B).await;
    let (status, _, text) = post_form(
        &server,
        &path,
        TOKEN_B,
        &[("csrf", &csrf_of(&other)), ("v", "x")],
    )
    .await;
    assert_eq!(status, 404, "{text}");
    // JSON the schema refuses: 422, the reason beside the form.
    let (status, _, text) =
        post_form(&server, &path, TOKEN_A, &[("csrf", &csrf), ("json", "42")]).await;
    assert_eq!(status, 422, "{text}");
    assert!(
        text.contains("does not fit the wait&#39;s schema")
            || text.contains("does not fit the wait's schema"),
        "{text}"
    );
    assert_eq!(
        head_seq(&server, &tree).await,
        before,
        "nothing was written"
    );

    // The form's answer: recorded, back to the tree page.
    let (status, location, _) = post_form(
        &server,
        &path,
        TOKEN_A,
        &[("csrf", &csrf), ("v", "ship it")],
    )
    .await;
    assert_eq!(status, 303);
    assert_eq!(location.unwrap(), format!("/trees/{tree}?notice=answered"));
    let done = server
        .get(
            &format!("/v1/trees/{tree}?until=terminal&timeout_ms=20000"),
            TOKEN_A,
        )
        .await;
    assert_eq!(done.json["status"], "done");
    let finished = done.json["head_seq"].as_u64().unwrap();

    // The same page again, stale: the wait is closed, nothing written; a
    // cancellation of the finished tree is refused in the page too.
    let (status, _, text) =
        post_form(&server, &path, TOKEN_A, &[("csrf", &csrf), ("v", "again")]).await;
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("no longer open"), "{text}");
    let (status, _, text) = post_form(
        &server,
        &format!("/trees/{tree}/cancel"),
        TOKEN_A,
        &[("csrf", &csrf), ("reason", "late")],
    )
    .await;
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("Nothing was written"), "{text}");
    assert_eq!(head_seq(&server, &tree).await, finished);

    // Verify and the live fragment.
    let (_, verified) = page(&server, &format!("/trees/{tree}?verify=1"), TOKEN_A).await;
    assert!(verified.contains("Log verified: records 1–"), "{verified}");
    let (_, live) = page(
        &server,
        &format!("/trees/{tree}/live?after={}", finished - 1),
        TOKEN_A,
    )
    .await;
    assert_eq!(live.matches("<tr data-seq=").count(), 1, "{live}");
    assert!(live.contains(r#"data-done="true""#), "{live}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stylesheet_and_script_are_embedded_and_pages_forbid_inline_script() {
    let server = Running::memory().await;
    for (path, kind) in [
        ("/assets/console.css", "text/css"),
        ("/assets/console.js", "text/javascript"),
    ] {
        let response = client()
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind)
        );
        assert!(
            !response.text().await.unwrap().contains("http://"),
            "no external fetch in {path}"
        );
    }
    let login = client()
        .get(format!("{}/login", server.base))
        .send()
        .await
        .unwrap();
    let policy = login.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"),
        "{policy}"
    );
    let page = login.text().await.unwrap();
    assert!(!page.contains("<script>"), "no inline script");
    assert!(
        page.contains("prefers-color-scheme") || page.contains("color-scheme"),
        "{page}"
    );
    server.stop().await;
}
