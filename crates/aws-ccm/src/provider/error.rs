//! The one error every provider trait returns: [`CloudError`].
//!
//! The rule: a controller decides what to do from the error's answers
//! ([`CloudError::is_denied`], [`CloudError::is_throttled`],
//! [`CloudError::in_use`], [`CloudError::is_not_found`], ...), never from a
//! cloud's error code or message. The cloud side answers them from its codes
//! in one place (on AWS, `aws/client/errors.rs`: the codes are classified
//! there and `From<AwsError> for CloudError` maps the answers), so a refusal
//! of IAM reads the same to the node, tagging, route and service
//! controllers alike. Every message names the operation that failed
//! (`ec2:CreateRoute: ...`), as the cloud's policy names it; a value the
//! user must fix ([`CloudError::invalid`]) names the value and the fix.

use std::fmt;

/// What went wrong, which decides what the caller does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The named object does not exist (an answer, not a failure).
    NotFound,
    /// The account's API budget is exhausted; retry later.
    Throttled,
    /// The cloud or the network failed; retrying may help.
    Transient,
    /// The cloud's policy (IAM) refused the call; the message names the
    /// permission. A multi-resource call is refused whole when any one
    /// resource in it is denied.
    Denied,
    /// The cloud refused to delete something another resource still uses;
    /// it frees up by itself.
    InUse,
    /// The object to create exists already (a repeated create, or someone
    /// else made it meanwhile).
    AlreadyExists,
    /// The cloud refused the request itself (invalid for the resource's
    /// state, over a quota, malformed): repeating it will not help.
    Rejected,
    /// A value the user must fix (an annotation, a tag, cloud.conf), found
    /// before a call could be made.
    Invalid,
}

/// A failed cloud call, or a value that stopped one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudError {
    kind: ErrorKind,
    /// The operation as the cloud's policy names it (`ec2:CreateRoute`);
    /// `None` only for [`ErrorKind::Invalid`], whose message names the value.
    operation: Option<String>,
    /// The whole text, naming the operation (see the constructors).
    message: String,
}

impl fmt::Display for CloudError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CloudError {}

impl CloudError {
    /// `operation` failed this way; `detail` says how and what to do. The
    /// text is `operation: detail`.
    pub fn new(
        operation: impl Into<String>,
        kind: ErrorKind,
        detail: impl AsRef<str>,
    ) -> CloudError {
        let operation = operation.into();
        CloudError {
            kind,
            message: format!("{operation}: {}", detail.as_ref()),
            operation: Some(operation),
        }
    }

    /// A failure the cloud's own error describes: `text` already names the
    /// operation as that cloud spells it (AWS: `EC2 CreateRoute failed after
    /// 3 attempt(s): ...`), so it is kept whole.
    pub(crate) fn described(
        operation: impl Into<String>,
        kind: ErrorKind,
        text: String,
    ) -> CloudError {
        CloudError {
            kind,
            operation: Some(operation.into()),
            message: text,
        }
    }

    /// A value the user must fix; `message` names the object, the value
    /// and the fix.
    pub(crate) fn invalid(message: impl Into<String>) -> CloudError {
        CloudError {
            kind: ErrorKind::Invalid,
            operation: None,
            message: message.into(),
        }
    }

    pub(crate) fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The operation that failed, as the cloud's policy names it.
    #[cfg(test)]
    pub(crate) fn operation(&self) -> Option<&str> {
        self.operation.as_deref()
    }

    pub(crate) fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }

    fn is_throttled(&self) -> bool {
        self.kind == ErrorKind::Throttled
    }

    /// IAM refused the call.
    pub(crate) fn is_denied(&self) -> bool {
        self.kind == ErrorKind::Denied
    }

    /// Another resource still uses the one to delete.
    pub(crate) fn in_use(&self) -> bool {
        self.kind == ErrorKind::InUse
    }

    pub(crate) fn is_already_exists(&self) -> bool {
        self.kind == ErrorKind::AlreadyExists
    }

    /// A value the user must fix, not a cloud failure.
    pub(crate) fn is_invalid(&self) -> bool {
        self.kind == ErrorKind::Invalid
    }

    /// Repeating the same request soon may succeed (throttling, 5xx,
    /// timeouts).
    pub(crate) fn is_transient(&self) -> bool {
        self.is_throttled() || self.kind == ErrorKind::Transient
    }

    /// The cloud refused the request itself: it answered, and the same
    /// request will get the same answer until something else changes.
    pub(crate) fn is_rejected(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Denied | ErrorKind::InUse | ErrorKind::AlreadyExists | ErrorKind::Rejected
        )
    }
}

/// A cloud call's answer.
pub(crate) type CloudResult<T> = Result<T, CloudError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_names_its_operation_and_a_bad_value_names_itself() {
        let err = CloudError::new("ec2:CreateRoute", ErrorKind::Denied, "not authorized");
        assert_eq!(err.to_string(), "ec2:CreateRoute: not authorized");
        assert_eq!(err.operation(), Some("ec2:CreateRoute"));
        let bad = CloudError::invalid("annotation x: value y is not allowed; use z");
        assert_eq!(
            bad.to_string(),
            "annotation x: value y is not allowed; use z"
        );
        assert_eq!(bad.operation(), None);
    }

    #[test]
    fn each_kind_answers_exactly_its_questions() {
        use ErrorKind::*;
        // kind: not found, throttled, denied, in use, transient, rejected
        let table = [
            (NotFound, [true, false, false, false, false, false]),
            (Throttled, [false, true, false, false, true, false]),
            (Transient, [false, false, false, false, true, false]),
            (Denied, [false, false, true, false, false, true]),
            (InUse, [false, false, false, true, false, true]),
            (AlreadyExists, [false, false, false, false, false, true]),
            (Rejected, [false, false, false, false, false, true]),
            (Invalid, [false, false, false, false, false, false]),
        ];
        for (kind, expected) in table {
            let err = CloudError::new("op", kind, "m");
            let got = [
                err.is_not_found(),
                err.is_throttled(),
                err.is_denied(),
                err.in_use(),
                err.is_transient(),
                err.is_rejected(),
            ];
            assert_eq!(got, expected, "{kind:?}");
        }
    }
}
