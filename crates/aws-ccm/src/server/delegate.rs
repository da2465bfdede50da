//! TokenReview and SubjectAccessReview against the API server: the
//! [`Reviewer`] the running binary uses.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::core::ClusterResourceScope;
use kube::{Api, Client};

use super::auth::{Auth, AuthSettings, Decision, Reviewer, UserInfo};
use crate::kube_client;

/// Upstream's `TokenRequestTimeout` / `ClientTimeout`.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Upstream raises the delegation client's limits so they never throttle serving.
const DELEGATION_QPS: f32 = 200.0;
const DELEGATION_BURST: u32 = 400;

struct KubeReviewer {
    authentication: Client,
    authorization: Client,
}

/// Creates the cluster-scoped review `object` through `client`, within
/// [`REVIEW_TIMEOUT`]; `what` names it in the error.
async fn create<K>(client: &Client, what: &str, object: &K) -> Result<K, String>
where
    K: kube::Resource<Scope = ClusterResourceScope, DynamicType = ()>,
    K: Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::all(client.clone());
    match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), object)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {REVIEW_TIMEOUT:?}")),
    }
}

impl Reviewer for KubeReviewer {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, String>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_string(),
                    audiences: None,
                },
                ..Default::default()
            };
            let answer = create(&self.authentication, "creating a TokenReview", &review).await?;
            let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
                return Ok(None);
            };
            let user = status.user.unwrap_or_default();
            Ok(Some(UserInfo {
                username: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default().into_iter().collect(),
            }))
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        path: &'a str,
        verb: &'a str,
    ) -> BoxFuture<'a, Result<Decision, String>> {
        Box::pin(async move {
            let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: non_empty(&user.username),
                    uid: non_empty(&user.uid),
                    groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
                    extra: (!user.extra.is_empty())
                        .then(|| user.extra.clone().into_iter().collect()),
                    non_resource_attributes: Some(NonResourceAttributes {
                        path: Some(path.to_string()),
                        verb: Some(verb.to_string()),
                    }),
                    resource_attributes: None,
                },
                ..Default::default()
            };
            let what = "creating a SubjectAccessReview";
            let answer = create(&self.authorization, what, &review).await?;
            let status = answer.status.unwrap_or_default();
            Ok(Decision {
                allowed: status.allowed && status.denied != Some(true),
                reason: status.reason.unwrap_or_default(),
            })
        })
    }
}

async fn delegation_client(path: Option<&Path>, main: &Client) -> anyhow::Result<Client> {
    let Some(path) = path else {
        return Ok(main.clone());
    };
    let config = kube_client::load_config(Some(path), None).await?;
    Ok(kube_client::build_client(
        config,
        DELEGATION_QPS,
        DELEGATION_BURST,
    )?)
}

/// The authenticator/authorizer of the running binary: the delegation
/// kubeconfigs if given, else the main client.
pub async fn build(settings: AuthSettings, main: &Client) -> anyhow::Result<Arc<Auth>> {
    let authentication =
        delegation_client(settings.authentication_kubeconfig.as_deref(), main).await?;
    let authorization =
        delegation_client(settings.authorization_kubeconfig.as_deref(), main).await?;
    tracing::info!(
        always_allow_paths = ?settings.always_allow_paths,
        "HTTPS endpoint: bearer tokens are checked with TokenReview and requests with SubjectAccessReview; \
         client-certificate and front-proxy authentication are not implemented"
    );
    Ok(Auth::new(
        Arc::new(KubeReviewer {
            authentication,
            authorization,
        }),
        settings,
    ))
}
