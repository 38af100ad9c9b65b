//! OpenAI-style error responses, so clients see the same shape as from the engine.

use serde_json::json;

/// An error kvroute answers itself instead of forwarding the request.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub code: &'static str,
    pub param: Option<&'static str>,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(code: &'static str, param: Option<&'static str>, message: String) -> Self {
        ApiError { status: 400, kind: "invalid_request_error", code, param, message }
    }

    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            status: 404,
            kind: "invalid_request_error",
            code: "model_not_found",
            param: Some("model"),
            message: format!("The model `{model}` does not exist or is not served here."),
        }
    }

    /// A body over the configured limit (the same shape as Envoy's own 413, mapped in the
    /// shipped bootstrap).
    pub fn too_large(limit_bytes: usize) -> Self {
        ApiError {
            status: 413,
            kind: "invalid_request_error",
            code: "request_too_large",
            param: None,
            message: format!(
                "request body is larger than the {} MiB limit",
                limit_bytes.div_ceil(1 << 20)
            ),
        }
    }

    /// A client that sent part of its body and then nothing for `waited_ms` (408, as Envoy's
    /// own request timeout answers).
    pub fn body_timeout(waited_ms: u64) -> Self {
        ApiError {
            status: 408,
            kind: "invalid_request_error",
            code: "request_timeout",
            param: None,
            message: format!("the request body stopped arriving for {waited_ms} ms"),
        }
    }

    /// The JSON body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Vec<u8> {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
        .to_string()
        .into_bytes()
    }
}

impl From<crate::decision::request::RequestError> for ApiError {
    fn from(e: crate::decision::request::RequestError) -> Self {
        use crate::decision::request::RequestError as E;
        let code = match e {
            E::InvalidJson(_) | E::NotAnObject => "invalid_json",
            E::MissingModel => "missing_model",
            _ => "invalid_value",
        };
        ApiError::bad_request(code, e.param(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::model_not_found("x");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(e.status, 404);
    }
}
