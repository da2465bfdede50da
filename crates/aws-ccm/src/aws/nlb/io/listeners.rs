//! NLB, I/O: the listener steps of a plan (create, modify, attributes,
//! delete) and the NLB's tag steps, whose records of listener settings wait
//! for the listener writes they stand for.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancingv2::Client;
use aws_sdk_elasticloadbalancingv2::operation::create_listener::CreateListenerOutput;
use aws_sdk_elasticloadbalancingv2::types as t;

use super::{Applying, forward, once_visible, sdk_tags, tls_parts};
use crate::aws::AwsClient;
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::nlb::{Change, Listener, TgRef};
use crate::aws::tags;

impl Applying<'_> {
    /// One listener step of the plan.
    pub(super) async fn listener_step(&mut self, change: &Change) -> Result<(), AwsError> {
        match change {
            Change::CreateListener {
                listener,
                tags,
                alpn,
            } => self.create_listener(listener, tags, alpn).await,
            Change::ModifyListener {
                arn,
                listener,
                alpn,
            } => self.modify_listener(arn, listener, alpn).await,
            Change::ModifyListenerAttributes {
                arn,
                port,
                attributes,
            } => {
                self.modify_listener_attributes(arn.as_deref(), *port, attributes)
                    .await
            }
            Change::DeleteListener { arn } => self.delete_listener(arn).await,
            // `step` sends only the listener steps here.
            _ => Ok(()),
        }
    }

    /// Whether tag `key` on `arn` (`None`: the NLB) is this CCM's record of
    /// a listener setting it applied while a listener write of this apply
    /// was refused: then the record would claim what AWS did not take.
    fn record_unproven(&self, arn: Option<&str>, key: &str) -> bool {
        arn.is_none()
            && !self.out.refused_listeners.is_empty()
            && tags::LISTENER_SETTING_RECORDS.contains(&key)
    }

    /// Tags a target group (`arn`) or, without one, the NLB; a record of a
    /// listener setting is left out while a listener write of this apply
    /// was refused ([`Self::record_unproven`]).
    pub(super) async fn add_tags(
        &self,
        arn: Option<&str>,
        tags: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        let tags: BTreeMap<String, String> = (tags.iter())
            .filter(|(k, _)| !self.record_unproven(arn, k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if tags.is_empty() {
            return Ok(());
        }
        let arn = arn.map_or_else(|| self.lb(), |a| Ok(a.to_string()))?;
        let tags = sdk_tags(&tags);
        self.call(Operation::Elbv2AddTags, |c| {
            c.add_tags()
                .resource_arns(&arn)
                .set_tags(Some(tags.clone()))
                .send()
        })
        .await
    }

    /// Removes tag `keys` from a target group or listener (`arn`) or,
    /// without one, the NLB.
    pub(super) async fn remove_tags(
        &self,
        arn: Option<&str>,
        keys: &BTreeSet<String>,
    ) -> Result<(), AwsError> {
        let keys: Vec<String> = (keys.iter())
            .filter(|k| !self.record_unproven(arn, k))
            .cloned()
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        let arn = arn.map_or_else(|| self.lb(), |a| Ok(a.to_string()))?;
        self.call(Operation::Elbv2RemoveTags, |c| {
            c.remove_tags()
                .resource_arns(&arn)
                .set_tag_keys(Some(keys.clone()))
                .send()
        })
        .await
    }

    async fn create_listener(
        &mut self,
        listener: &Listener,
        tags: &BTreeMap<String, String>,
        alpn: &Option<String>,
    ) -> Result<(), AwsError> {
        let arn = self.lb()?;
        let tg = self.target_group(&TgRef::Name(listener.target_group.clone()))?;
        let tags = sdk_tags(tags);
        let (certs, policy) = tls_parts(listener);
        let create = || {
            self.aws.elbv2(Operation::Elbv2CreateListener, |c| {
                c.create_listener()
                    .load_balancer_arn(&arn)
                    .port(listener.port)
                    .protocol(t::ProtocolEnum::from(listener.protocol.as_str()))
                    .default_actions(forward(&tg))
                    .set_certificates(certs.clone())
                    .set_ssl_policy(policy.clone())
                    .set_alpn_policy(alpn.clone().map(|p| vec![p]))
                    .set_tags(Some(tags.clone()))
                    .send()
            })
        };
        let arn_of = |out: CreateListenerOutput| {
            let made = out.listeners().first().and_then(|l| l.listener_arn());
            made.map(str::to_string)
        };
        let made = match create().await {
            Ok(out) => arn_of(out),
            // The listener on this port may exist (a lost answer, or a sync
            // that read before it was visible): read before re-creating, as
            // a second create could make a second listener. The next sync's
            // plan modifies it if its settings differ.
            Err(e) if e.may_have_been_applied() || e.is_already_exists() => {
                tracing::info!(load_balancer = self.name, port = listener.port, error = %e, "listener create may have been applied; reading it");
                match existing_listener(self.aws, &arn, listener.port).await {
                    Ok(found) => Some(found),
                    Err(missing) if missing.is_not_found() => arn_of(create().await?),
                    Err(other) => return Err(other),
                }
            }
            Err(e) => return Err(e),
        };
        if let Some(made) = made {
            self.out.listeners.insert(listener.port, made);
        }
        Ok(())
    }

    /// The listener on `port`'s attributes (`arn`, or the one this plan
    /// created). A write IAM refuses is recorded, not an error.
    async fn modify_listener_attributes(
        &mut self,
        arn: Option<&str>,
        port: i32,
        attributes: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        let arn = match arn.or(self.out.listeners.get(&port).map(String::as_str)) {
            Some(a) => a.to_string(),
            None => existing_listener(self.aws, &self.lb()?, port).await?,
        };
        let attributes: Vec<t::ListenerAttribute> = attributes
            .iter()
            .map(|(k, v)| t::ListenerAttribute::builder().key(k).value(v).build())
            .collect();
        let modified = self.call(Operation::Elbv2ModifyListenerAttributes, |c| {
            c.modify_listener_attributes()
                .listener_arn(&arn)
                .set_attributes(Some(attributes.clone()))
                .send()
        });
        match modified.await {
            Err(e) if e.is_denied() => self.out.refused_listeners.push((arn, e)),
            other => other?,
        }
        Ok(())
    }

    /// A write IAM refuses is recorded, not an error.
    async fn modify_listener(
        &mut self,
        arn: &str,
        listener: &Listener,
        alpn: &Option<String>,
    ) -> Result<(), AwsError> {
        let tg = self.target_group(&TgRef::Name(listener.target_group.clone()))?;
        let (certs, policy) = tls_parts(listener);
        let modified = self.call(Operation::Elbv2ModifyListener, |c| {
            c.modify_listener()
                .listener_arn(arn)
                .port(listener.port)
                .protocol(t::ProtocolEnum::from(listener.protocol.as_str()))
                .default_actions(forward(&tg))
                .set_certificates(certs.clone())
                .set_ssl_policy(policy.clone())
                .set_alpn_policy(alpn.clone().map(|p| vec![p]))
                .send()
        });
        match modified.await {
            Err(e) if e.is_denied() => self.out.refused_listeners.push((arn.to_string(), e)),
            other => other?,
        }
        Ok(())
    }

    /// A write IAM refuses is recorded, not an error; a listener already
    /// gone is fine.
    async fn delete_listener(&mut self, arn: &str) -> Result<(), AwsError> {
        let deleted = self.call(Operation::Elbv2DeleteListener, |c| {
            c.delete_listener().listener_arn(arn).send()
        });
        match deleted.await {
            Err(e) if e.is_denied() => self.out.refused_listeners.push((arn.to_string(), e)),
            Err(e) if !e.is_not_found() => return Err(e),
            _ => {}
        }
        Ok(())
    }
}

/// The ARN of the listener on `port` of NLB `lb_arn`, waiting for it to
/// become visible.
pub(super) async fn existing_listener(
    aws: &AwsClient,
    lb_arn: &str,
    port: i32,
) -> Result<String, AwsError> {
    let what = format!("the listener on port {port} of {lb_arn}");
    let describe = |c: Client| c.describe_listeners().load_balancer_arn(lb_arn).send();
    once_visible(
        aws,
        Operation::Elbv2DescribeListeners,
        &what,
        describe,
        |out| {
            let listener = out.listeners().iter().find(|l| l.port() == Some(port))?;
            Some(listener.listener_arn()?.to_string())
        },
    )
    .await
}
