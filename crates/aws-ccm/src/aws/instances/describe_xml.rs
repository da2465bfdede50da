//! `DescribeInstances` pages decoded straight into [`Ec2Instance`]s.
//!
//! The SDK decodes a page into its full `Instance` model before the CCM
//! keeps a dozen fields of it: for a page of 1,000 instances that model is
//! about 10 MB (every interface, tag, block device and option, with each
//! list's growth slack), and it was the largest transient of the steady
//! state, once per 1,000 nodes per refresh period.
//!
//! [`SlimDecoder`] is an interceptor for that one call. On a successful
//! response it wraps the body: as the SDK reads it, the wrapper reads the
//! page with the SDK's own XML reader into [`RawInstance`]s (the form the
//! SDK path converts through too, so the same rules apply), leaves them in
//! a [`Slot`], and hands the SDK a page holding only the next-page token.
//! Error responses are not touched, and a body it cannot read is handed on
//! whole: then the SDK decodes it and the caller converts the SDK's model
//! as before. A surprise on the wire costs memory, never correctness.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::ConfigBag;
use aws_smithy_xml::decode::{Document, ScopedDecoder, XmlDecodeError, try_data};
use bytes::Bytes;
use hyper::body::{Body, Frame};
use parking_lot::Mutex;

use super::plan::Interner;
use super::{Ec2Instance, RawInstance, RawInterface, Text, TextPair};

/// One decoded page.
#[derive(Debug, Default)]
pub struct Page {
    pub instances: Vec<Ec2Instance>,
    pub next_token: Option<String>,
}

/// Where the decoder leaves its page for the caller (the last attempt's,
/// when the call was retried).
#[derive(Clone, Debug, Default)]
pub struct Slot(Arc<Mutex<Option<Page>>>);

impl Slot {
    /// The decoded page; `None` when the SDK decoded the body (then the
    /// output carries the SDK's model).
    pub fn take(&self) -> Option<Page> {
        self.0.lock().take()
    }
}

/// The interceptor to add to one `DescribeInstances` call.
#[derive(Debug)]
pub struct SlimDecoder {
    slot: Slot,
}

impl SlimDecoder {
    pub fn new(slot: Slot) -> SlimDecoder {
        SlimDecoder { slot }
    }
}

impl Intercept for SlimDecoder {
    fn name(&self) -> &'static str {
        "SlimDescribeInstances"
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let response = context.response_mut();
        if !response.status().is_success() {
            return Ok(());
        }
        let inner = std::mem::replace(response.body_mut(), SdkBody::taken());
        // Content-Length, when sent, sizes the buffer once (bounded, as a
        // header is only a claim).
        let expected = inner.size_hint().lower().min(64 << 20) as usize;
        *response.body_mut() = SdkBody::from_body_1_x(SlimBody {
            inner,
            read: Vec::with_capacity(expected),
            slot: self.slot.clone(),
            done: false,
        });
        Ok(())
    }
}

/// A response body read whole, then handed on as the token-only page (or
/// as read, when it is not a page this module can decode).
struct SlimBody {
    inner: SdkBody,
    read: Vec<u8>,
    slot: Slot,
    done: bool,
}

impl SlimBody {
    fn finish(&mut self) -> Bytes {
        let read = std::mem::take(&mut self.read);
        let decoded = std::str::from_utf8(&read)
            .map_err(|e| XmlDecodeError::custom(e.to_string()))
            .and_then(decode_page);
        match decoded {
            Ok(page) => {
                let rest = token_only_page(page.next_token.as_deref());
                *self.slot.0.lock() = Some(page);
                Bytes::from(rest)
            }
            Err(err) => {
                tracing::warn!(error = %err, "DescribeInstances page not read by the slim decoder; the SDK reads it");
                Bytes::from(read)
            }
        }
    }
}

impl Body for SlimBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.read.extend_from_slice(&data);
                    }
                }
                Poll::Ready(None) => {
                    self.done = true;
                    let page = self.finish();
                    return Poll::Ready(Some(Ok(Frame::data(page))));
                }
            }
        }
    }
}

/// A `DescribeInstancesResponse` with no reservations and `token`.
fn token_only_page(token: Option<&str>) -> String {
    let token = token
        .map(|t| {
            let escaped = t
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;");
            format!("<nextToken>{escaped}</nextToken>")
        })
        .unwrap_or_default();
    format!(
        "<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">{token}</DescribeInstancesResponse>"
    )
}

/// Decodes a `DescribeInstancesResponse` body.
pub(crate) fn decode_page(xml: &str) -> Result<Page, XmlDecodeError> {
    // The XML reader accepts a document cut short; a page cut short would
    // read as the last page, and the sweep would miss instances.
    if !xml.trim_end().ends_with("</DescribeInstancesResponse>") {
        return Err(XmlDecodeError::custom(
            "the page does not end where a DescribeInstancesResponse ends",
        ));
    }
    let mut doc = Document::new(xml);
    let mut root = doc.root_element()?;
    if !root.start_el().matches("DescribeInstancesResponse") {
        return Err(XmlDecodeError::custom("not a DescribeInstancesResponse"));
    }
    let mut strings = Interner::default();
    let mut page = Page::default();
    while let Some(mut tag) = root.next_tag() {
        if tag.start_el().matches("reservationSet") {
            while let Some(mut reservation) = tag.next_tag() {
                while let Some(mut field) = reservation.next_tag() {
                    if !field.start_el().matches("instancesSet") {
                        continue;
                    }
                    while let Some(mut item) = field.next_tag() {
                        let raw = raw_instance(&mut item)?;
                        page.instances.extend(raw.convert(&mut strings));
                    }
                }
            }
        } else if tag.start_el().matches("nextToken") {
            page.next_token = Some(try_data(&mut tag)?.into_owned()).filter(|t| !t.is_empty());
        }
    }
    page.instances.shrink_to_fit();
    Ok(page)
}

fn text<'a>(tag: &mut ScopedDecoder<'a, '_>) -> Result<Text<'a>, XmlDecodeError> {
    try_data(tag).map(Some)
}

/// `true`/`false` as the SDK reads a boolean.
fn boolean(tag: &mut ScopedDecoder<'_, '_>) -> Result<bool, XmlDecodeError> {
    match try_data(tag)?.as_ref() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(XmlDecodeError::custom(format!(
            "expected a boolean, got {other:?}"
        ))),
    }
}

/// The `name` child of each `<item>` of a list.
fn items<'a>(
    list: &mut ScopedDecoder<'a, '_>,
    name: &str,
) -> Result<Vec<Text<'a>>, XmlDecodeError> {
    let mut out = Vec::new();
    while let Some(mut item) = list.next_tag() {
        out.push(child(&mut item, name)?);
    }
    Ok(out)
}

/// Two children of each `<item>` of a list (a group's ID and name, a
/// tag's key and value).
fn pairs<'a>(
    list: &mut ScopedDecoder<'a, '_>,
    first: &str,
    second: &str,
) -> Result<Vec<TextPair<'a>>, XmlDecodeError> {
    let mut out = Vec::new();
    while let Some(mut item) = list.next_tag() {
        let (mut a, mut b) = (None, None);
        while let Some(mut field) = item.next_tag() {
            if field.start_el().matches(first) {
                a = text(&mut field)?;
            } else if field.start_el().matches(second) {
                b = text(&mut field)?;
            }
        }
        out.push((a, b));
    }
    Ok(out)
}

/// The first `child` of an element (`placement/availabilityZone`).
fn child<'a>(tag: &mut ScopedDecoder<'a, '_>, name: &str) -> Result<Text<'a>, XmlDecodeError> {
    let mut value = None;
    while let Some(mut field) = tag.next_tag() {
        if value.is_none() && field.start_el().matches(name) {
            value = text(&mut field)?;
        }
    }
    Ok(value)
}

/// One `instancesSet` item; elements not named here are skipped.
fn raw_instance<'a>(item: &mut ScopedDecoder<'a, '_>) -> Result<RawInstance<'a>, XmlDecodeError> {
    let mut raw = RawInstance::default();
    while let Some(mut tag) = item.next_tag() {
        match tag.start_el().local() {
            "instanceId" => raw.id = text(&mut tag)?,
            "placement" => raw.availability_zone = child(&mut tag, "availabilityZone")?,
            "instanceType" => raw.instance_type = text(&mut tag)?,
            "instanceState" => raw.state = child(&mut tag, "name")?,
            "privateDnsName" => raw.private_dns_name = text(&mut tag)?,
            "dnsName" => raw.public_dns_name = text(&mut tag)?,
            "privateIpAddress" => raw.private_ip = text(&mut tag)?,
            "ipAddress" => raw.public_ip = text(&mut tag)?,
            "subnetId" => raw.subnet_id = text(&mut tag)?,
            "vpcId" => raw.vpc_id = text(&mut tag)?,
            "sourceDestCheck" => raw.source_dest_check = Some(boolean(&mut tag)?),
            "groupSet" => raw.security_groups = pairs(&mut tag, "groupId", "groupName")?,
            "tagSet" => raw.tags = pairs(&mut tag, "key", "value")?,
            "networkInterfaceSet" => {
                while let Some(mut eni) = tag.next_tag() {
                    raw.network_interfaces.push(raw_interface(&mut eni)?);
                }
            }
            _ => {}
        }
    }
    Ok(raw)
}

fn raw_interface<'a>(eni: &mut ScopedDecoder<'a, '_>) -> Result<RawInterface<'a>, XmlDecodeError> {
    let mut raw = RawInterface::default();
    while let Some(mut tag) = eni.next_tag() {
        match tag.start_el().local() {
            "networkInterfaceId" => raw.id = text(&mut tag)?,
            // The interface's own status (the attachment's is inside it).
            "status" => raw.status = text(&mut tag)?,
            "attachment" => {
                raw.device_index = match child(&mut tag, "deviceIndex")? {
                    Some(index) => Some(index.parse().map_err(|_| {
                        XmlDecodeError::custom(format!("expected a device index, got {index:?}"))
                    })?),
                    None => None,
                }
            }
            "privateIpAddress" => raw.private_ip = text(&mut tag)?,
            "privateIpAddressesSet" => {
                while let Some(mut item) = tag.next_tag() {
                    let (mut address, mut primary) = (None, false);
                    while let Some(mut field) = item.next_tag() {
                        if field.start_el().matches("privateIpAddress") {
                            address = text(&mut field)?;
                        } else if field.start_el().matches("primary") {
                            primary = boolean(&mut field)?;
                        }
                    }
                    raw.private_ips.push((address, primary));
                }
            }
            "ipv6AddressesSet" => raw.ipv6_addresses = items(&mut tag, "ipv6Address")?,
            "association" => raw.public_ip = child(&mut tag, "publicIp")?,
            _ => {}
        }
    }
    Ok(raw)
}
