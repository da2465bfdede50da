//! The service admission check (`--service-admission-webhook`): a
//! validating webhook at [`PATH`] that answers kube-apiserver's
//! `admission.k8s.io/v1` AdmissionReview for a Service with Warnings, never
//! a refusal, so `kubectl apply` prints at once what the service
//! controller's Warning events would say later (and events age out).
//!
//! Why a webhook served here, not a generated ValidatingAdmissionPolicy
//! with `validationActions: [Warn]`: the warnings come from the very
//! reading the controller syncs from ([`LoadBalancerSpec::read_with`], the
//! annotation table's parsers with cloud.conf's refusals) and are worded by
//! the same function as its events ([`Reading::findings`]), so the two
//! cannot drift. A CEL policy would be a second parser of every annotation
//! kept in step by hand, and could not see cloud.conf.
//!
//! It never blocks a write: every answer is `allowed: true`; the
//! configuration the chart installs says `failurePolicy: Ignore` with a
//! short timeout, so a down or slow CCM costs an apply at most that
//! timeout. kube-apiserver calls webhooks without credentials by default,
//! so this path is served outside the authentication of the other routes:
//! it only reads the object it is sent and answers about that object, and
//! reads at most [`MAX_BODY`] bytes for at most [`READ_TIMEOUT`].
//!
//! [`Reading::findings`]: crate::provider::load_balancers::Reading::findings

use std::sync::{Arc, LazyLock};

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::core::v1::Service;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{Value, json};

use crate::cloud_config::CloudConfig;
use crate::controllers::service::{has_load_balancer, wants_load_balancer};
use crate::provider::load_balancers::{LoadBalancerSpec, is_external};

/// Where kube-apiserver sends the reviews (the chart's
/// ValidatingWebhookConfiguration names it).
pub const PATH: &str = "/admission/v1/services";

/// The largest review read: kube-apiserver's request body limit (3 MiB)
/// and the review's envelope. A review carries the object and, on an
/// update, the old one, each at most etcd's 1.5 MiB; a larger body is
/// answered 413, which `failurePolicy: Ignore` lets through unwarned.
const MAX_BODY: usize = 4 * 1024 * 1024;
/// The longest a review's body is read: kube-apiserver's longest webhook
/// timeout (`timeoutSeconds` at most 30), after which no caller waits.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    /// `warned`, `clean` (no warning) or `malformed` (not read, or not a
    /// review: answered 400, 408 or 413).
    result: &'static str,
}

/// `aws_ccm_service_admission_reviews_total{result}`.
static REVIEWS: LazyLock<Family<ReviewLabels, Counter>> = LazyLock::new(|| {
    crate::metrics::registered(
        "aws_ccm_service_admission_reviews",
        "AdmissionReviews the service admission check answered, by result: warned (one or more Warnings), clean (none), malformed (not read in time or size, or not a review: refused with 408, 413 or 400)",
        Family::default(),
    )
});

fn counted(result: &'static str) {
    REVIEWS.get_or_create(&ReviewLabels { result }).inc();
}

/// What the check reads besides the Service: cloud.conf, whose NLB and
/// health-probe refusals the controller applies to every Service.
pub struct ServiceAdmission {
    pub cloud: Arc<CloudConfig>,
}

/// The route, with no authentication in front of it (see the module).
pub(crate) fn router(admission: Arc<ServiceAdmission>) -> Router {
    Router::new()
        .route(PATH, post(review))
        .with_state(admission)
}

async fn review(State(admission): State<Arc<ServiceAdmission>>, body: Body) -> Response {
    let body = match tokio::time::timeout(READ_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await
    {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            counted("malformed");
            tracing::warn!(error = %e, limit = MAX_BODY, "admission review not read");
            let text = format!("the body was not read (at most {MAX_BODY} bytes): {e}");
            return (StatusCode::PAYLOAD_TOO_LARGE, text).into_response();
        }
        Err(_) => {
            counted("malformed");
            tracing::warn!(timeout = ?READ_TIMEOUT, "admission review not read in time");
            return (StatusCode::REQUEST_TIMEOUT, "the body was not sent in time").into_response();
        }
    };
    let answer = serde_json::from_slice::<Value>(&body)
        .map_err(|e| format!("the body is not JSON: {e}"))
        .and_then(|review| answer(&admission.cloud, &review));
    match answer {
        Ok(answer) => {
            let warned = answer["response"].get("warnings").is_some();
            counted(if warned { "warned" } else { "clean" });
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                answer.to_string(),
            )
                .into_response()
        }
        Err(e) => {
            counted("malformed");
            tracing::warn!(error = %e, "admission review refused as malformed");
            (StatusCode::BAD_REQUEST, e).into_response()
        }
    }
}

/// The AdmissionReview answering `review`: allowed, with a warning for each
/// value the Service's load balancer sync refuses, holds or ignores.
fn answer(cloud: &CloudConfig, review: &Value) -> Result<Value, String> {
    if review.get("apiVersion").and_then(Value::as_str) != Some("admission.k8s.io/v1")
        || review.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
    {
        return Err("expected an admission.k8s.io/v1 AdmissionReview".into());
    }
    let request = review
        .get("request")
        .ok_or("the AdmissionReview has no request")?;
    let uid = request
        .get("uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .ok_or("the AdmissionReview's request has no uid")?;
    let warnings = warnings(cloud, request);
    if !warnings.is_empty() {
        let namespace = request.get("namespace").and_then(Value::as_str);
        let name = request.get("name").and_then(Value::as_str);
        tracing::info!(
            service = %format!("{}/{}", namespace.unwrap_or_default(), name.unwrap_or_default()),
            warnings = warnings.len(),
            "admission: warned about the Service's values"
        );
    }
    let mut response = json!({"uid": uid, "allowed": true});
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    Ok(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
}

/// The warnings for one request: only a core/v1 Service created or updated
/// that this CCM would sync (`type: LoadBalancer`, no class, not handed to
/// another controller) gets any.
fn warnings(cloud: &CloudConfig, request: &Value) -> Vec<String> {
    let kind = request.get("kind").unwrap_or(&Value::Null);
    let is_service = kind.get("group").and_then(Value::as_str) == Some("")
        && kind.get("version").and_then(Value::as_str) == Some("v1")
        && kind.get("kind").and_then(Value::as_str) == Some("Service");
    let operation = request.get("operation").and_then(Value::as_str);
    if !is_service || !matches!(operation, Some("CREATE" | "UPDATE")) {
        return Vec::new();
    }
    let Some(svc) = request
        .get("object")
        .and_then(|o| serde_json::from_value::<Service>(o.clone()).ok())
    else {
        return Vec::new();
    };
    if !wants_load_balancer(&svc) || is_external(&svc) {
        return Vec::new();
    }
    let reading = LoadBalancerSpec::read_with(&svc, cloud);
    reading
        .findings(has_load_balancer(&svc))
        .into_iter()
        .map(|f| f.message)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;

    fn review(operation: &str, object: Value) -> Value {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Service"},
                "resource": {"group": "", "version": "v1", "resource": "services"},
                "operation": operation,
                "namespace": "default",
                "name": "web",
                "object": object,
            }
        })
    }

    fn service(annotations: Value, type_: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default", "annotations": annotations},
            "spec": {"type": type_, "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]},
        })
    }

    fn warnings_of(answer: &Value) -> Vec<String> {
        answer["response"]["warnings"]
            .as_array()
            .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_refused_value_is_warned_with_the_events_words_and_never_refused() {
        let cloud = CloudConfig::default();
        let svc = service(
            json!({"service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "often"}),
            "LoadBalancer",
        );
        let answer = answer(&cloud, &review("CREATE", svc.clone())).unwrap();
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(
            answer["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
        let reading = LoadBalancerSpec::read_with(&serde_json::from_value(svc).unwrap(), &cloud);
        let event = reading.refusal(false).unwrap();
        let warnings = warnings_of(&answer);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // The event joins the refused values; the warning is that one value.
        let value = event.strip_prefix("Error syncing load balancer: ").unwrap();
        assert_eq!(warnings[0], value);
        assert!(warnings[0].contains("healthcheck-interval=\"often\""));
    }

    #[test]
    fn a_good_service_and_services_not_ours_get_no_warning() {
        let cloud = CloudConfig::default();
        let bad =
            json!({"service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "often"});
        let cases = [
            review("CREATE", service(json!({}), "LoadBalancer")),
            review("UPDATE", service(bad.clone(), "ClusterIP")),
            review("DELETE", service(bad.clone(), "LoadBalancer")),
            {
                let mut handed = bad.clone();
                handed["service.beta.kubernetes.io/aws-load-balancer-type"] = json!("external");
                review("CREATE", service(handed, "LoadBalancer"))
            },
        ];
        for case in cases {
            let answer = answer(&cloud, &case).unwrap();
            assert_eq!(answer["response"]["allowed"], true);
            assert!(answer["response"].get("warnings").is_none(), "{case}");
        }
    }

    #[tokio::test]
    async fn a_body_too_large_or_too_slow_is_not_read_past_its_bound() {
        use tower::ServiceExt;
        let app = router(Arc::new(ServiceAdmission {
            cloud: Arc::new(CloudConfig::default()),
        }));
        let post = |body: Body| {
            axum::http::Request::post(PATH)
                .header(header::CONTENT_TYPE, "application/json")
                .body(body)
                .unwrap()
        };
        let large = Body::from(vec![b' '; MAX_BODY + 1]);
        let answer = app.clone().oneshot(post(large)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::PAYLOAD_TOO_LARGE);
        // A body that never ends: answered at the bound, not held open.
        tokio::time::pause();
        let endless = futures::stream::pending::<Result<Bytes, std::io::Error>>();
        let started = tokio::time::Instant::now();
        let answer = app.oneshot(post(Body::from_stream(endless))).await.unwrap();
        assert_eq!(answer.status(), StatusCode::REQUEST_TIMEOUT);
        // tokio's timer rounds a deadline up to its next millisecond tick.
        let waited = started.elapsed();
        assert!(waited >= READ_TIMEOUT, "{waited:?}");
        assert!(waited < READ_TIMEOUT + Duration::from_secs(1), "{waited:?}");
    }

    #[test]
    fn a_malformed_review_is_refused_as_such() {
        let cloud = CloudConfig::default();
        let mut no_uid = review("CREATE", service(json!({}), "LoadBalancer"));
        no_uid["request"]["uid"] = json!("");
        assert!(answer(&cloud, &no_uid).is_err());
        let mut v1beta1 = review("CREATE", service(json!({}), "LoadBalancer"));
        v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
        assert!(answer(&cloud, &v1beta1).is_err());
    }
}
