use std::collections::BTreeSet;

use super::super::route;
use super::*;

fn document() -> serde_json::Value {
    serde_json::from_str(openapi_json()).expect("the document is JSON")
}

#[test]
fn the_document_is_openapi_3_1_with_this_version() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

/// A route added to the router without a description, or a description of a route that is
/// gone, fails here.
#[test]
fn every_route_is_described_and_nothing_else() {
    let doc = document();
    let described: BTreeSet<&str> = doc["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .map(String::as_str)
        .collect();
    let routed: BTreeSet<&str> = route::ALL.into_iter().collect();
    assert_eq!(described, routed);
}

/// Every error answer is `{error, detail}` (a 429 is a decision, not an error: `Refusal`), and
/// every operation that reads a body says how a bad one is answered.
#[test]
fn errors_have_one_shape_and_bodies_a_400() {
    let doc = document();
    let error = &doc["components"]["schemas"]["ErrorBody"];
    assert_eq!(error["required"], serde_json::json!(["error", "detail"]));
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = operation["responses"].as_object().unwrap();
            for (status, response) in responses {
                if status != "429" && (status.starts_with('4') || status.starts_with('5')) {
                    let schema = &response["content"]["application/json"]["schema"]["$ref"];
                    assert_eq!(
                        schema, "#/components/schemas/ErrorBody",
                        "{method} {path} {status}"
                    );
                }
            }
            if operation.get("requestBody").is_some() {
                assert!(responses.contains_key("400"), "{method} {path}");
                assert!(responses.contains_key("413"), "{method} {path}");
            }
        }
    }
}
