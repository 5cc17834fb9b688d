//! The server's one error type: a status, a message, the field at fault,
//! and the API whose shape it takes (set once per route); and reading a
//! body into JSON with errors that name the field.
use super::fields::FieldError;
use super::shared::PinError;
use crate::request::RequestError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// Which API's error shape to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `{"error": "message"}`
    Ollama,
    /// `{"error": {"message", "type", "code"}}`
    OpenAi,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub flavor: Flavor,
    /// The request field at fault (OpenAI's `error.param`).
    pub param: Option<String>,
    /// OpenAI's `error.code`, where the status alone does not say it.
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            flavor: Flavor::Ollama,
            param: None,
            code: None,
        }
    }
    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn flavor(mut self, f: Flavor) -> Self {
        self.flavor = f;
        self
    }
    /// A refused field: 400, naming it.
    pub fn field(e: FieldError) -> Self {
        let mut a = Self::bad(e.to_string());
        a.param = Some(e.field().to_string());
        a
    }
    pub fn model_not_found(name: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("model '{name}' not found"))
    }
}

/// A refused request: 400, naming its field.
impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        let mut a = Self::bad(e.to_string());
        a.param = Some(e.field().to_string());
        a
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.flavor {
            Flavor::Ollama => json!({ "error": self.message }),
            Flavor::OpenAi => json!({ "error": {
                "message": self.message,
                "type": match self.status.as_u16() {
                    401 => "authentication_error",
                    403 => "permission_error",
                    429 => "rate_limit_error",
                    _ if self.status.is_server_error() => "server_error",
                    _ => "invalid_request_error",
                },
                "code": match self.status.as_u16() {
                    _ if self.code.is_some() => json!(self.code),
                    401 => json!("invalid_api_key"),
                    404 => json!("model_not_found"),
                    503 => json!("server_busy"),
                    _ => Value::Null,
                },
                "param": self.param,
            }}),
        };
        let mut r = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE
            || self.status == StatusCode::TOO_MANY_REQUESTS
        {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// A pinned policy that cannot run.
impl From<PinError> for ApiError {
    fn from(e: PinError) -> Self {
        match e {
            PinError::Malformed(m) => ApiError::bad(m),
            PinError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, m),
            PinError::Store(m) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m),
        }
    }
}

/// Parses a JSON body with an error that names the offending field.
pub fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                e.status(),
                "the request body is over this server's limit (--max-body-bytes)",
            )
        } else {
            ApiError::new(
                e.status(),
                format!("cannot read the body: {}", e.body_text()),
            )
        }
    })?;
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::bad(
            "the request body is empty; expected a JSON object",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(&body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::bad(format!("invalid JSON body: {inner}"))
        } else {
            ApiError::bad(format!("invalid JSON body: field `{path}`: {inner}"))
        }
    })
}

/// Deserializes a part of a parsed body; errors name the field as
/// `prefix` + its path.
pub fn from_value<T: DeserializeOwned>(v: Value, prefix: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let field = match (prefix.trim_end_matches('.'), path.as_str()) {
            ("", "" | ".") => String::new(),
            (p, "" | ".") => p.to_string(),
            ("", q) => q.to_string(),
            (_, q) => format!("{prefix}{q}"),
        };
        if field.is_empty() {
            ApiError::bad(format!("invalid request: {inner}"))
        } else {
            ApiError::bad(format!("invalid request: field `{field}`: {inner}"))
        }
    })
}
