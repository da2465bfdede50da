//! Placeholder: this controller is being built.

use tokio_util::sync::CancellationToken;

use super::ControllerContext;

/// Runs the controller until `stop` is cancelled.
pub async fn run(_ctx: ControllerContext, stop: CancellationToken) {
    tracing::warn!("controller is selected but not implemented in this build; it does nothing");
    stop.cancelled().await;
}
