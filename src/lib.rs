//! The `maintenance-operator` package: the operator binary's commands, shared with the
//! `kubectl-maintenance` plugin.

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod api_calls;
pub mod http;
pub mod kubectl;
pub mod leader;
pub mod plan;
pub mod run;
pub mod serve;
pub mod webhook;

use kube::api::{Api, ListParams};

/// Objects per page of [`list_all`]: enough for few round trips, small enough that a
/// 5,000-node cluster is never one response.
const LIST_PAGE_SIZE: u32 = 500;

/// Lists every object `params` selects, page by page (following the API server's continue
/// token), so that listing a big cluster costs neither one huge response nor one huge request.
pub async fn list_all<K>(api: &Api<K>, params: ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut objects = Vec::new();
    let mut params = params.limit(LIST_PAGE_SIZE);
    loop {
        let page = api.list(&params).await?;
        objects.extend(page.items);
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(objects),
        }
    }
}
