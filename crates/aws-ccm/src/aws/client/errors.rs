//! Errors from the AWS client layer, and the classification that drives retries.
//!
//! Every failure is put in one of four [`ErrorClass`]es. Only throttling and
//! transient errors are retried; not-found and fatal errors go straight back to
//! the caller, because repeating the same request cannot change the answer and
//! would only spend the account's shared API budget.

use std::time::Duration;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use aws_types::request_id::RequestId;

use super::operations::{KOPS_GAPS, Operation};
use crate::provider::{CloudError, ErrorKind};

/// What kind of failure an error is, which decides whether it is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// AWS refused the request for rate (`RequestLimitExceeded`, `Throttling`,
    /// HTTP 429, ...). Retried after backoff; lowers the category's rate.
    Throttling,
    /// The request may succeed if repeated: 5xx, `InternalError`,
    /// `ServiceUnavailable`, timeouts, connection resets, dispatch failures.
    Transient,
    /// The object named in the request does not exist (`*.NotFound`,
    /// `LoadBalancerNotFound`, `TargetGroupNotFound`, ...). Never retried:
    /// callers usually treat it as an answer, not a failure.
    NotFound,
    /// Repeating will not help: validation, authorization, dependency
    /// violations, quotas. Never retried.
    Fatal,
}

impl ErrorClass {
    /// Whether the client retries errors of this class.
    pub(crate) fn is_retryable(self) -> bool {
        matches!(self, ErrorClass::Throttling | ErrorClass::Transient)
    }

    /// Label value used in metrics (`outcome`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Throttling => "throttled",
            ErrorClass::Transient => "transient",
            ErrorClass::NotFound => "not_found",
            ErrorClass::Fatal => "fatal",
        }
    }
}

impl std::fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// AWS error codes that mean "slow down". From the EC2, ELB and STS error
/// references plus the codes the AWS SDKs treat as throttling.
const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "SlowDown",
    "EC2ThrottledException",
    "ProvisionedThroughputExceededException",
    "BandwidthLimitExceeded",
    "TransactionInProgressException",
];

/// AWS error codes for failures on AWS's side that a repeat may fix.
const TRANSIENT_CODES: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "InternalServiceError",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "Unavailable",
    "RequestTimeout",
    "RequestTimeoutException",
    "PriorRequestNotComplete",
    "IDPCommunicationError",
];

/// Classifies an AWS error code. `None` when the code alone does not decide
/// (then the HTTP status does).
fn classify_code(code: &str) -> Option<ErrorClass> {
    if THROTTLING_CODES.contains(&code) {
        return Some(ErrorClass::Throttling);
    }
    if TRANSIENT_CODES.contains(&code) {
        return Some(ErrorClass::Transient);
    }
    // EC2 spells not-found as `<Thing>.NotFound` (InvalidInstanceID.NotFound,
    // InvalidRouteTableID.NotFound, InvalidGroup.NotFound, ...); ELB as
    // `<Thing>NotFound` (LoadBalancerNotFound, TargetGroupNotFound,
    // ListenerNotFound, PolicyNotFound); some services add `Exception`.
    if code.ends_with("NotFound") || code.ends_with("NotFoundException") || code == "NoSuchEntity" {
        return Some(ErrorClass::NotFound);
    }
    None
}

/// Classifies by HTTP status when the code did not decide.
fn classify_status(status: u16) -> ErrorClass {
    match status {
        429 => ErrorClass::Throttling,
        500..=599 => ErrorClass::Transient,
        _ => ErrorClass::Fatal,
    }
}

/// What one failed attempt looked like, before it becomes an [`AwsError`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AttemptFailure {
    pub(crate) class: ErrorClass,
    pub(crate) code: Option<String>,
    message: String,
    pub(crate) http_status: Option<u16>,
    request_id: Option<String>,
}

impl AttemptFailure {
    /// Builds a failure from a code/status pair (used by tests and the
    /// timeout path).
    pub(crate) fn new(
        class: ErrorClass,
        code: Option<&str>,
        message: impl Into<String>,
    ) -> AttemptFailure {
        AttemptFailure {
            class,
            code: code.map(str::to_string),
            message: message.into(),
            http_status: None,
            request_id: None,
        }
    }

    /// Classifies an SDK error. Every SDK operation returns
    /// `SdkError<OperationError, HttpResponse>`.
    pub(crate) fn from_sdk<E>(err: &SdkError<E, HttpResponse>) -> AttemptFailure
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let http_status = err.raw_response().map(|r| r.status().as_u16());
        let request_id = err.request_id().map(str::to_string);
        let (class, code, message) = match err {
            SdkError::ServiceError(service) => {
                let source = service.err();
                let code = source.code().map(str::to_string);
                let message = source
                    .message()
                    .map(str::to_string)
                    .unwrap_or_else(|| error_chain(source));
                let class = code
                    .as_deref()
                    .and_then(classify_code)
                    .unwrap_or_else(|| classify_status(http_status.unwrap_or(400)));
                (class, code, message)
            }
            // The SDK's own timeouts (connect/read) and any failure to get a
            // response at all: the request may not have reached AWS, or the
            // answer was lost; both are worth another try.
            SdkError::TimeoutError(_) => (ErrorClass::Transient, None, error_chain(err)),
            SdkError::DispatchFailure(dispatch) => {
                // A "user" dispatch failure is a request the HTTP client
                // refused to send (bad URI, bad header): repeating it fails
                // the same way.
                let class = if dispatch.is_user() {
                    ErrorClass::Fatal
                } else {
                    ErrorClass::Transient
                };
                (class, None, error_chain(err))
            }
            // The response arrived but could not be read (truncated body,
            // connection closed mid-response, a proxy's HTML page). A 4xx
            // here is still an answer about the request itself.
            SdkError::ResponseError(_) => {
                let class = match http_status {
                    Some(429) => ErrorClass::Throttling,
                    Some(400..500) => ErrorClass::Fatal,
                    _ => ErrorClass::Transient,
                };
                (class, None, error_chain(err))
            }
            // The SDK could not even build the request (missing required
            // field, bad endpoint): a bug in the caller.
            SdkError::ConstructionFailure(_) => (ErrorClass::Fatal, None, error_chain(err)),
            _ => (ErrorClass::Transient, None, error_chain(err)),
        };
        AttemptFailure {
            class,
            code,
            message,
            http_status,
            request_id,
        }
    }
}

/// Joins an error and its sources into one line, so a dispatch failure shows
/// the underlying "connection reset by peer" rather than "dispatch failure".
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = inner.source();
    }
    out
}

/// The error every [`super::AwsClient`] method returns.
///
/// It carries the operation, the [`ErrorClass`], and the AWS code and message
/// when AWS answered, and its `Display` says what to do about it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum AwsError {
    /// AWS (or the network) failed the request, on the last attempt made.
    #[error(
        "{operation} failed after {attempts} attempt(s): {detail}{request}. {hint}",
        detail = describe(.code.as_deref(), .message, *.http_status),
        request = .request_id.as_deref().map(|id| format!(" (request id {id})")).unwrap_or_default(),
        hint = hint(*.operation, *.class, .code.as_deref()),
    )]
    Api {
        operation: Operation,
        class: ErrorClass,
        code: Option<String>,
        message: String,
        http_status: Option<u16>,
        request_id: Option<String>,
        attempts: u32,
    },

    /// A lookup found nothing, without AWS returning an error (for example a
    /// coalesced `DescribeInstances` whose result did not include this ID).
    #[error(
        "{what} was not found by {operation}: it does not exist in this account and Region \
         (or was created moments ago; EC2 is eventually consistent). Check the ID or name"
    )]
    NotFound { operation: Operation, what: String },

    /// An attempt's answer was lost (no answer in time, a reset connection,
    /// a 5xx) so AWS may have applied it. With `applied`, a later attempt
    /// proved it did (a duplicate answer to a create, a not-found answer to
    /// a removal: `last`); without, the door did not repeat the call (an
    /// [`super::operations::Idempotency::ReadBeforeRepeat`] operation) or
    /// ran out of attempts, and `last` is the last failure. Either way the
    /// caller reads the current state before doing more.
    #[error(
        "{operation}: the answer to an earlier attempt was lost{verdict}; last answer: {last}",
        operation = .last.operation(),
        verdict = if *.applied { " and AWS had applied it" } else { ", so AWS may have applied it" },
    )]
    AnswerLost { applied: bool, last: Box<AwsError> },

    /// The call was not sent: this process stopped changing AWS because it
    /// can no longer prove it leads (see `docs/operations.md`).
    #[error(
        "{operation} was not sent: this replica lost the leader Lease and makes no more changes to AWS \
         ({attempts} attempt(s) made before); the new leader carries on"
    )]
    Stopped { operation: Operation, attempts: u32 },

    /// The caller's deadline passed before the call could finish (waiting for
    /// a rate-limit token, or between retries).
    #[error(
        "{operation} did not finish within the caller's deadline ({elapsed:?} spent, {attempts} attempt(s)){last}. \
         It is retried on the next reconcile; if this repeats, the account's API budget is saturated: \
         raise --aws-api-budget-fraction or reduce other API users",
        last = .last.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default(),
    )]
    DeadlineExceeded {
        operation: Operation,
        attempts: u32,
        elapsed: Duration,
        last: Option<Box<AwsError>>,
    },
}

impl AwsError {
    /// The class, which decides whether retrying could help.
    pub fn class(&self) -> ErrorClass {
        match self {
            AwsError::Api { class, .. } => *class,
            AwsError::NotFound { .. } => ErrorClass::NotFound,
            // Running out of time is not a statement about the request.
            AwsError::DeadlineExceeded { .. } => ErrorClass::Transient,
            AwsError::AnswerLost {
                applied: true,
                last,
            } => last.class(),
            AwsError::AnswerLost { applied: false, .. } => ErrorClass::Transient,
            AwsError::Stopped { .. } => ErrorClass::Fatal,
        }
    }

    /// The operation that failed.
    pub(crate) fn operation(&self) -> Operation {
        match self {
            AwsError::Api { operation, .. }
            | AwsError::NotFound { operation, .. }
            | AwsError::DeadlineExceeded { operation, .. }
            | AwsError::Stopped { operation, .. } => *operation,
            AwsError::AnswerLost { last, .. } => last.operation(),
        }
    }

    /// The AWS error code (`InvalidInstanceID.NotFound`, ...), when AWS sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            AwsError::Api { code, .. } => code.as_deref(),
            AwsError::NotFound { .. } => None,
            AwsError::DeadlineExceeded { last, .. } => last.as_deref().and_then(AwsError::code),
            AwsError::AnswerLost { last, .. } => last.code(),
            AwsError::Stopped { .. } => None,
        }
    }

    /// The AWS error message, or a description of the failure.
    pub(crate) fn message(&self) -> String {
        match self {
            AwsError::Api { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// How many requests were sent for this call.
    #[cfg(test)]
    pub(crate) fn attempts(&self) -> u32 {
        match self {
            AwsError::Api { attempts, .. }
            | AwsError::DeadlineExceeded { attempts, .. }
            | AwsError::Stopped { attempts, .. } => *attempts,
            AwsError::NotFound { .. } => 1,
            AwsError::AnswerLost { last, .. } => last.attempts(),
        }
    }

    /// True when an earlier attempt's answer was lost and a later answer
    /// proved AWS had applied it: the object exists (a create) or is gone
    /// (a removal); the caller re-reads it and carries on.
    pub(crate) fn applied_before_answer_lost(&self) -> bool {
        matches!(self, AwsError::AnswerLost { applied: true, .. })
    }

    /// True when AWS may have applied the call although it failed: an
    /// answer was lost. The caller reads before re-creating.
    pub(crate) fn may_have_been_applied(&self) -> bool {
        matches!(self, AwsError::AnswerLost { .. })
    }

    /// True when AWS answered and refused the request itself (an API error
    /// of class [`ErrorClass::Fatal`]: validation, configuration, quota, IAM),
    /// whatever its code: repeating it unchanged will not help, and nothing
    /// was applied. Not for a lost answer, a deadline or a stop.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(
            self,
            AwsError::Api {
                class: ErrorClass::Fatal,
                ..
            }
        )
    }

    pub(crate) fn is_not_found(&self) -> bool {
        self.class() == ErrorClass::NotFound
    }

    /// IAM refused the call (EC2's `UnauthorizedOperation`, the query
    /// APIs' `AccessDenied`, the JSON APIs' `AccessDeniedException`): the
    /// one list every caller asks, so none misses a service's spelling.
    pub(crate) fn is_denied(&self) -> bool {
        self.code().is_some_and(|c| DENIED_CODES.contains(&c))
    }

    /// AWS refused to delete what another resource still uses
    /// ([`IN_USE_CODES`]); it frees up by itself.
    pub(crate) fn is_in_use(&self) -> bool {
        self.code().is_some_and(|c| IN_USE_CODES.contains(&c))
    }

    /// The operation is not offered here (EC2's `UnsupportedOperation`: a
    /// Region without `DescribeInstanceTopology`, a call the instance's
    /// type cannot take).
    pub(crate) fn is_unsupported(&self) -> bool {
        self.code() == Some("UnsupportedOperation")
    }

    /// ELBv2 refused a target it does not hold or cannot take
    /// (`InvalidTarget`): to a deregistration, the target is not there.
    pub(crate) fn is_invalid_target(&self) -> bool {
        self.code() == Some("InvalidTarget")
    }

    /// EC2's answer to a `DryRun=true` request that would have been
    /// allowed (`DryRunOperation`).
    pub(crate) fn is_dry_run_allowed(&self) -> bool {
        self.code() == Some(DRY_RUN_ALLOWED_CODE)
    }

    /// AWS refused to register targets because the load balancer holds as
    /// many as its quota allows (ELBv2's `TooManyTargets`, "You cannot have
    /// more than N targets per network load balancer"). Deregistering
    /// targets makes room. The Classic ELB's register call documents no
    /// such error (only `LoadBalancerNotFound` and `InvalidInstance`).
    pub(crate) fn is_target_quota(&self) -> bool {
        self.code().is_some_and(|c| TARGET_QUOTA_CODES.contains(&c))
    }

    /// EC2 refused a rule past the security group's rules limit
    /// (`RulesPerSecurityGroupLimitExceeded`: 60 inbound rules by default,
    /// each CIDR or source group of a permission counting as one).
    pub(crate) fn is_rule_limit(&self) -> bool {
        self.code() == Some("RulesPerSecurityGroupLimitExceeded")
    }

    pub fn is_throttling(&self) -> bool {
        self.class() == ErrorClass::Throttling
            || matches!(self, AwsError::DeadlineExceeded { last: Some(last), .. } if last.is_throttling())
    }

    /// True for the "it is already there" answers a repeated create can get
    /// (`InvalidGroup.Duplicate`, `InvalidPermission.Duplicate`,
    /// `RouteAlreadyExists`, `DuplicateLoadBalancerName`, ...). Callers of
    /// [`super::operations::Idempotency::ReadBeforeRepeat`] operations treat
    /// this as success after reading the current state. Also true through
    /// [`AwsError::AnswerLost`].
    pub fn is_already_exists(&self) -> bool {
        self.code().is_some_and(|code| {
            code.ends_with(".Duplicate")
                || code.starts_with("Duplicate")
                || code.ends_with("AlreadyExists")
                || code.ends_with("AlreadyExistsException")
        })
    }

    /// A failure found by this client, not answered by AWS: no code, no
    /// HTTP status.
    pub(crate) fn local(
        operation: Operation,
        class: ErrorClass,
        message: impl Into<String>,
        attempts: u32,
    ) -> AwsError {
        AwsError::from_attempt(
            operation,
            AttemptFailure::new(class, None, message),
            attempts,
        )
    }

    pub(crate) fn from_attempt(
        operation: Operation,
        failure: AttemptFailure,
        attempts: u32,
    ) -> AwsError {
        AwsError::Api {
            operation,
            class: failure.class,
            code: failure.code,
            message: failure.message,
            http_status: failure.http_status,
            request_id: failure.request_id,
            attempts,
        }
    }
}

/// The provider's error: every answer a controller asks of an AWS failure
/// is decided here, from the classes and codes above, and nowhere else.
impl From<AwsError> for CloudError {
    fn from(err: AwsError) -> CloudError {
        let kind = if err.is_denied() {
            ErrorKind::Denied
        } else if err.is_throttling() {
            ErrorKind::Throttled
        } else if err.is_not_found() {
            ErrorKind::NotFound
        } else if err.is_already_exists() {
            ErrorKind::AlreadyExists
        } else if err.is_in_use() {
            ErrorKind::InUse
        } else if err.class().is_retryable() {
            ErrorKind::Transient
        } else {
            ErrorKind::Rejected
        };
        // The door's text names the operation first, with the attempts and
        // the fix: kept whole.
        CloudError::described(err.operation().iam_action(), kind, err.to_string())
    }
}

fn describe(code: Option<&str>, message: &str, http_status: Option<u16>) -> String {
    let status = http_status
        .map(|s| format!(" (HTTP {s})"))
        .unwrap_or_default();
    match code {
        Some(code) if message.is_empty() => format!("{code}{status}"),
        Some(code) => format!("{code}: {message}{status}"),
        None => format!("{message}{status}"),
    }
}

/// EC2's answer to a DryRun request that would have succeeded.
const DRY_RUN_ALLOWED_CODE: &str = "DryRunOperation";

/// The metrics outcome of an answer to a `DryRun=true` request, when it is
/// one: EC2 says `DryRunOperation` (HTTP 412) when the caller may make the
/// request and `UnauthorizedOperation` (HTTP 403) when IAM denies it.
pub(super) fn dry_run_outcome(code: &str) -> Option<&'static str> {
    match code {
        DRY_RUN_ALLOWED_CODE => Some("dry_run_allowed"),
        code if DENIED_CODES.contains(&code) => Some("dry_run_denied"),
        _ => None,
    }
}

/// IAM's refusals, as each API spells them.
const DENIED_CODES: &[&str] = &[
    "UnauthorizedOperation",
    "AccessDenied",
    "AccessDeniedException",
];

/// AWS refusing to delete what another resource still uses: EC2's
/// `DependencyViolation` (a security group an ENI or load balancer still
/// names), ELBv2's `ResourceInUse` (a target group a listener still
/// forwards to). Both free up by themselves once the user goes.
const IN_USE_CODES: &[&str] = &["DependencyViolation", "ResourceInUse"];

/// The targets-per-load-balancer quota, as ELBv2's RegisterTargets spells
/// it on the wire (the SDK's `TooManyTargetsException`).
const TARGET_QUOTA_CODES: &[&str] = &["TooManyTargets"];

/// Refusals of the credentials themselves, beside IAM's [`DENIED_CODES`].
const CREDENTIAL_CODES: &[&str] = &[
    "AuthFailure",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "OptInRequired",
    "UnrecognizedClientException",
];

/// What the user can do about an error of this class and code.
fn hint(operation: Operation, class: ErrorClass, code: Option<&str>) -> String {
    match class {
        ErrorClass::Throttling => format!(
            "AWS throttled every attempt; the client lowered its {} rate and the work is retried on the next \
             reconcile. If it persists, other tools are spending this account's API budget: slow them down, \
             lower --aws-api-budget-fraction, or ask AWS for a higher rate limit",
            operation.category()
        ),
        ErrorClass::Transient => "AWS or the network failed transiently; the work is retried on the next reconcile. \
             If it persists, check connectivity to the AWS endpoint and the AWS Health Dashboard"
            .to_string(),
        ErrorClass::NotFound => "The object does not exist (or is not visible yet: AWS is eventually consistent). \
             Check the ID or name"
            .to_string(),
        ErrorClass::Fatal => match code {
            Some(code) if DENIED_CODES.contains(&code) || CREDENTIAL_CODES.contains(&code) => {
                let action = operation.iam_action();
                // A tagged ELB create is also authorized as AddTags.
                let tagged_create = action.starts_with("elasticloadbalancing:Create");
                let kops = tagged_create || KOPS_GAPS.contains(&action.as_str());
                format!(
                    "The controller's credentials are not allowed to call {action}{}; add it to the IAM policy \
                     of the controller's role (see iam/) or fix the credentials{}",
                    if tagged_create {
                        " (or elasticloadbalancing:AddTags, which a create with tags also needs)"
                    } else {
                        ""
                    },
                    if kops {
                        ". Under kOps' own CCM policy, add the output of `iam/render.sh policy <cluster> \
                         --kops-additions` under spec.additionalPolicies.control-plane (docs/install-kops.md)"
                    } else {
                        ""
                    }
                )
            }
            Some(code) if IN_USE_CODES.contains(&code) => "Another AWS resource still uses this one; it is retried on \
                 the next reconcile, and succeeds once the dependency is gone"
                .to_string(),
            Some(code) if code.contains("LimitExceeded") || code.starts_with("TooMany") => {
                "An AWS quota is reached; raise it in Service Quotas or remove unused resources".to_string()
            }
            _ => "AWS rejected the request as invalid, so it is not retried; check the values named in the message \
                 (service annotations, cloud.conf)"
                .to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        use ErrorClass::*;
        let cases = [
            ("RequestLimitExceeded", Some(Throttling)),
            ("Throttling", Some(Throttling)),
            ("ThrottlingException", Some(Throttling)),
            ("RequestThrottled", Some(Throttling)),
            ("TooManyRequestsException", Some(Throttling)),
            ("SlowDown", Some(Throttling)),
            ("InternalError", Some(Transient)),
            ("ServiceUnavailable", Some(Transient)),
            ("Unavailable", Some(Transient)),
            ("InvalidInstanceID.NotFound", Some(NotFound)),
            ("InvalidRouteTableID.NotFound", Some(NotFound)),
            ("InvalidGroup.NotFound", Some(NotFound)),
            ("InvalidRoute.NotFound", Some(NotFound)),
            ("LoadBalancerNotFound", Some(NotFound)),
            ("TargetGroupNotFound", Some(NotFound)),
            ("ListenerNotFound", Some(NotFound)),
            ("InvalidParameterValue", None),
            ("DependencyViolation", None),
            ("UnauthorizedOperation", None),
            ("InvalidInstanceID.Malformed", None),
            ("RulesPerSecurityGroupLimitExceeded", None),
        ];
        for (code, expected) in cases {
            assert_eq!(classify_code(code), expected, "{code}");
        }
    }

    #[test]
    fn status_decides_when_the_code_does_not() {
        assert_eq!(classify_status(503), ErrorClass::Transient);
        assert_eq!(classify_status(500), ErrorClass::Transient);
        assert_eq!(classify_status(429), ErrorClass::Throttling);
        assert_eq!(classify_status(400), ErrorClass::Fatal);
        assert_eq!(classify_status(403), ErrorClass::Fatal);
    }

    fn api_error(class: ErrorClass, code: &str) -> AwsError {
        AwsError::from_attempt(
            Operation::Ec2CreateRoute,
            AttemptFailure::new(class, Some(code), "the message from AWS"),
            3,
        )
    }

    #[test]
    fn iam_refusals_are_denied_in_every_spelling_and_nothing_else_is() {
        for code in [
            "UnauthorizedOperation",
            "AccessDenied",
            "AccessDeniedException",
        ] {
            assert!(api_error(ErrorClass::Fatal, code).is_denied(), "{code}");
        }
        for code in ["AuthFailure", "Throttling", "InvalidInstanceID.NotFound"] {
            assert!(!api_error(ErrorClass::Fatal, code).is_denied(), "{code}");
        }
    }

    #[test]
    fn the_provider_error_answers_from_the_code_and_names_the_operation() {
        use crate::provider::ErrorKind::*;
        let cases = [
            (ErrorClass::Fatal, "UnauthorizedOperation", Denied),
            (ErrorClass::Fatal, "AccessDenied", Denied),
            (ErrorClass::Fatal, "AccessDeniedException", Denied),
            (ErrorClass::Throttling, "RequestLimitExceeded", Throttled),
            (ErrorClass::NotFound, "InvalidPermission.NotFound", NotFound),
            (ErrorClass::NotFound, "LoadBalancerNotFound", NotFound),
            (ErrorClass::NotFound, "NoSuchEntity", NotFound),
            (
                ErrorClass::Fatal,
                "InvalidPermission.Duplicate",
                AlreadyExists,
            ),
            (ErrorClass::Fatal, "RouteAlreadyExists", AlreadyExists),
            (ErrorClass::Fatal, "DependencyViolation", InUse),
            (ErrorClass::Fatal, "ResourceInUse", InUse),
            (ErrorClass::Transient, "InternalError", Transient),
            (ErrorClass::Fatal, "InvalidParameterValue", Rejected),
        ];
        for (class, code, kind) in cases {
            let cloud = CloudError::from(api_error(class, code));
            assert_eq!(cloud.kind(), kind, "{code}");
            assert_eq!(cloud.operation(), Some("ec2:CreateRoute"), "{code}");
            assert!(
                cloud.to_string().starts_with("EC2 CreateRoute failed"),
                "{cloud}"
            );
        }
        // A removal whose answer was lost and that a repeat found gone
        // answers as its last answer; one not proved applied is worth
        // repeating.
        let lost = |applied, class, code| AwsError::AnswerLost {
            applied,
            last: Box::new(api_error(class, code)),
        };
        let gone = lost(true, ErrorClass::NotFound, "InvalidRoute.NotFound");
        assert_eq!(CloudError::from(gone).kind(), NotFound);
        let unknown = lost(false, ErrorClass::Transient, "InternalError");
        assert_eq!(CloudError::from(unknown).kind(), Transient);
    }

    #[test]
    fn dry_run_answers_are_known_by_their_codes() {
        assert!(api_error(ErrorClass::Fatal, "DryRunOperation").is_dry_run_allowed());
        assert!(!api_error(ErrorClass::Fatal, "UnauthorizedOperation").is_dry_run_allowed());
        assert_eq!(dry_run_outcome("DryRunOperation"), Some("dry_run_allowed"));
        assert_eq!(
            dry_run_outcome("UnauthorizedOperation"),
            Some("dry_run_denied")
        );
        assert_eq!(dry_run_outcome("InvalidParameterValue"), None);
    }

    #[test]
    fn a_refusal_is_an_answer_of_class_fatal_whatever_its_code() {
        for code in [
            "InvalidConfigurationRequest",
            "ValidationError",
            "ACodeNobodyHasSeen",
            "AccessDenied",
        ] {
            assert!(api_error(ErrorClass::Fatal, code).is_refusal(), "{code}");
        }
        assert!(!api_error(ErrorClass::Transient, "InternalError").is_refusal());
        assert!(!api_error(ErrorClass::Throttling, "Throttling").is_refusal());
        assert!(!api_error(ErrorClass::NotFound, "LoadBalancerNotFound").is_refusal());
        // A lost answer may have been applied: not a refusal.
        let lost = AwsError::AnswerLost {
            applied: true,
            last: Box::new(api_error(ErrorClass::Fatal, "ValidationError")),
        };
        assert!(!lost.is_refusal());
    }

    #[test]
    fn the_target_quota_is_known_by_its_wire_code_only() {
        assert!(api_error(ErrorClass::Fatal, "TooManyTargets").is_target_quota());
        let lost = AwsError::AnswerLost {
            applied: true,
            last: Box::new(api_error(ErrorClass::Fatal, "TooManyTargets")),
        };
        assert!(lost.is_target_quota());
        for code in [
            "TooManyRegistrationsForTargetId",
            "TooManyTargetGroups",
            "TooManyLoadBalancers",
            "InvalidTarget",
        ] {
            assert!(
                !api_error(ErrorClass::Fatal, code).is_target_quota(),
                "{code}"
            );
        }
    }

    #[test]
    fn display_names_operation_code_message_and_what_to_do() {
        let err = api_error(ErrorClass::Fatal, "UnauthorizedOperation");
        let text = err.to_string();
        assert!(text.contains("EC2 CreateRoute"), "{text}");
        assert!(
            text.contains("UnauthorizedOperation: the message from AWS"),
            "{text}"
        );
        assert!(text.contains("3 attempt(s)"), "{text}");
        assert!(text.contains("ec2:CreateRoute"), "{text}");
        assert!(text.contains("IAM policy"), "{text}");

        let text = api_error(ErrorClass::Throttling, "RequestLimitExceeded").to_string();
        assert!(text.contains("ec2_mutating"), "{text}");
        assert!(text.contains("--aws-api-budget-fraction"), "{text}");

        let text = api_error(ErrorClass::Fatal, "DependencyViolation").to_string();
        assert!(text.contains("still uses"), "{text}");

        let text = api_error(ErrorClass::Fatal, "InvalidParameterValue").to_string();
        assert!(text.contains("not retried"), "{text}");
    }

    #[test]
    fn accessors_expose_class_code_and_operation() {
        let err = api_error(ErrorClass::NotFound, "InvalidRoute.NotFound");
        assert!(err.is_not_found());
        assert!(!err.class().is_retryable());
        assert_eq!(err.code(), Some("InvalidRoute.NotFound"));
        assert_eq!(err.operation(), Operation::Ec2CreateRoute);
        assert_eq!(err.message(), "the message from AWS");

        let deadline = AwsError::DeadlineExceeded {
            operation: Operation::Ec2CreateRoute,
            attempts: 2,
            elapsed: Duration::from_secs(3),
            last: Some(Box::new(api_error(
                ErrorClass::Throttling,
                "RequestLimitExceeded",
            ))),
        };
        assert!(deadline.is_throttling());
        assert_eq!(deadline.code(), Some("RequestLimitExceeded"));
        assert!(deadline.to_string().contains("last error"), "{deadline}");

        assert!(api_error(ErrorClass::Fatal, "InvalidGroup.Duplicate").is_already_exists());
        assert!(api_error(ErrorClass::Fatal, "RouteAlreadyExists").is_already_exists());
        assert!(!api_error(ErrorClass::Fatal, "InvalidParameterValue").is_already_exists());
    }
}
