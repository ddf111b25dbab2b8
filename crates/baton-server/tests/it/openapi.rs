//! The served OpenAPI document parses with an OpenAPI crate written apart
//! from the generator and lists every route.

use reqwest::Method;

use crate::support::Running;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_every_route() {
    let server = Running::memory().await;
    let reply = server.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(reply.status, 200);
    let document = oas3::from_json(&reply.text).unwrap();
    assert!(document.openapi.starts_with("3."), "{}", document.openapi);
    let expected: &[(&str, &[&str])] = &[
        ("/healthz", &["get"]),
        ("/readyz", &["get"]),
        ("/openapi.json", &["get"]),
        ("/v1/trees", &["get", "post"]),
        ("/v1/trees/{id}", &["get"]),
        ("/v1/trees/{id}/log", &["get"]),
        ("/v1/trees/{id}/events", &["get"]),
        ("/v1/trees/{id}/waits/{wait_id}", &["post"]),
        ("/v1/trees/{id}/cancel", &["post"]),
        ("/v1/trees/{id}/effects/{effect_id}/resolve", &["post"]),
    ];
    let paths = document.paths.unwrap();
    assert_eq!(paths.len(), expected.len(), "{:?}", paths.keys());
    for (path, methods) in expected {
        let Some(item) = paths.get(*path) else {
            panic!("{path} is not in the document");
        };
        for method in *methods {
            let operation = match *method {
                "get" => item.get.as_ref(),
                "post" => item.post.as_ref(),
                _ => None,
            };
            let operation =
                operation.unwrap_or_else(|| panic!("{method} {path} is not in the document"));
            // Every tree route declares the bearer token and its 401.
            if path.starts_with("/v1/") {
                assert!(!operation.security.is_empty(), "{path}");
                assert!(
                    operation
                        .responses
                        .as_ref()
                        .is_some_and(|responses| responses.contains_key("401")),
                    "{method} {path}"
                );
            }
        }
    }
    let components = document.components.unwrap();
    assert!(components.security_schemes.contains_key("bearer"));
    for schema in ["Problem", "StartBody", "ResolveBody", "TreeList"] {
        assert!(components.schemas.contains_key(schema), "{schema}");
    }
    server.stop().await;
}
