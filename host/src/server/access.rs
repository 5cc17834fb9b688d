//! Who may do what: API keys for inference, the admin key for the policy
//! registry, and the body limit of every route (checked from
//! `Content-Length` before a body is read).
//!
//! Routes fall in four classes: open (`/`, `/health`, `/ui`), metrics
//! (`/metrics`: open unless `metrics_key_required`), inference (every other
//! `/api/*` and `/v1/*` route: an API key when any is configured; the admin
//! key works too) and admin (`POST /api/policies`, `DELETE
//! /api/policies/{name}`). Keys are compared as sha256 digests in constant
//! time, against every configured key.
use super::config::AccessConfig;
use super::error::{ApiError, Flavor};
use super::State;
use axum::extract::{MatchedPath, Request};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

type KeyDigest = [u8; 32];

fn digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// Equality whose time does not depend on where the digests differ.
fn ct_eq(a: &KeyDigest, b: &KeyDigest) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// A key's id: the first 8 hex digits of its sha256 (never the key).
pub fn key_id(key: &str) -> String {
    specd_store::hex(&digest(key)[..4])
}

/// Who made a request, as the guard found it (a request extension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// No key needed, none checked.
    Anonymous,
    /// An API key (its id).
    User(String),
    /// The admin key (its id).
    Admin(String),
}

impl Caller {
    pub fn key_id(&self) -> Option<&str> {
        match self {
            Caller::Anonymous => None,
            Caller::User(id) | Caller::Admin(id) => Some(id),
        }
    }
}

/// What upload and delete need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryMode {
    /// No keys at all, on loopback: anyone who reaches the port (as before).
    Open,
    /// The admin key.
    AdminKey,
    /// Nobody; the reason, for the 403 and the start-up line.
    ReadOnly(String),
}

/// The access rules of a running server.
pub struct Access {
    user: Vec<KeyDigest>,
    admin: Option<KeyDigest>,
    metrics_keyed: bool,
    pub registry: RegistryMode,
}

/// The `Authorization` header as the guard reads it.
enum Presented {
    None,
    Malformed,
    Key(String),
}

fn presented(req: &Request) -> Presented {
    let Some(v) = req.headers().get(header::AUTHORIZATION) else {
        return Presented::None;
    };
    let Ok(v) = v.to_str() else {
        return Presented::Malformed;
    };
    match v.trim().split_once(' ') {
        Some((scheme, key)) if scheme.eq_ignore_ascii_case("bearer") && !key.trim().is_empty() => {
            Presented::Key(key.trim().to_string())
        }
        _ => Presented::Malformed,
    }
}

/// Which rule a route falls under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Open,
    Metrics,
    Inference,
    Admin,
}

fn class(method: &Method, route: Option<&str>, path: &str) -> Class {
    match (route, method) {
        (Some("/api/policies"), &Method::POST)
        | (Some("/api/policies/{name}"), &Method::DELETE) => Class::Admin,
        (Some("/metrics"), _) => Class::Metrics,
        // The served model's tokenizer: what inference keys may use.
        (Some("/tokenize" | "/detokenize"), _) => Class::Inference,
        // Unknown paths under the APIs need a key too: no probing.
        _ if path == "/api"
            || path == "/v1"
            || path.starts_with("/api/")
            || path.starts_with("/v1/") =>
        {
            Class::Inference
        }
        _ => Class::Open,
    }
}

impl Access {
    /// `loopback`: the server listens on a loopback address only; `addr`:
    /// where it listens (for messages).
    pub fn new(cfg: &AccessConfig, loopback: bool, addr: &str) -> Access {
        let user: Vec<KeyDigest> = cfg.api_keys.iter().map(|k| digest(&k.0)).collect();
        let admin = cfg.admin_key.as_ref().map(|k| digest(&k.0));
        let registry = if admin.is_some() {
            RegistryMode::AdminKey
        } else if !user.is_empty() {
            RegistryMode::ReadOnly(
                "the server has API keys but no admin key (start it with --admin-key or SPECD_ADMIN_KEY to allow uploads and deletes)".into(),
            )
        } else if !loopback {
            RegistryMode::ReadOnly(format!(
                "the server listens on {addr}, not on loopback, and has no admin key (start it with --admin-key or SPECD_ADMIN_KEY to allow uploads and deletes)"
            ))
        } else {
            RegistryMode::Open
        };
        Access {
            user,
            admin,
            metrics_keyed: cfg.metrics_key_required,
            registry,
        }
    }

    fn any_key(&self) -> bool {
        !self.user.is_empty() || self.admin.is_some()
    }

    /// Lines for the start-up message.
    pub fn describe(&self) -> Vec<String> {
        let mut out = vec![];
        out.push(if self.user.is_empty() {
            "inference: open (no API keys)".to_string()
        } else {
            format!(
                "inference: {} API key{} (Authorization: Bearer KEY)",
                self.user.len(),
                if self.user.len() == 1 { "" } else { "s" }
            )
        });
        out.push(match &self.registry {
            RegistryMode::Open => "policy registry: open (loopback, no keys)".to_string(),
            RegistryMode::AdminKey => {
                "policy registry: upload and delete need the admin key".into()
            }
            RegistryMode::ReadOnly(why) => format!("policy registry: READ-ONLY: {why}"),
        });
        out.push(
            if self.metrics_keyed && self.any_key() {
                "/metrics: needs a key"
            } else {
                "/metrics: open"
            }
            .to_string(),
        );
        out
    }

    /// Which configured key `key` is, checking every one (no early exit).
    fn identify(&self, key: &str) -> Option<Caller> {
        let d = digest(key);
        let mut user = false;
        for k in &self.user {
            user |= ct_eq(k, &d);
        }
        let admin = self.admin.as_ref().is_some_and(|k| ct_eq(k, &d));
        if admin {
            Some(Caller::Admin(key_id(key)))
        } else if user {
            Some(Caller::User(key_id(key)))
        } else {
            None
        }
    }

    /// A request that needs some key (`what` names it for messages).
    fn need_key(&self, p: Presented, what: &str) -> Result<Caller, ApiError> {
        match p {
            Presented::None => Err(unauthorized(format!(
                "missing API key: this route needs {what}; send it as `Authorization: Bearer KEY`"
            ))),
            Presented::Malformed => Err(unauthorized(
                "the Authorization header must be `Bearer KEY`".to_string(),
            )),
            Presented::Key(k) => self
                .identify(&k)
                .ok_or_else(|| unauthorized("invalid API key".to_string())),
        }
    }

    fn check(&self, class: Class, p: Presented) -> Result<Caller, ApiError> {
        match class {
            Class::Open => Ok(Caller::Anonymous),
            Class::Metrics if !self.metrics_keyed || !self.any_key() => Ok(Caller::Anonymous),
            Class::Metrics => self.need_key(p, "an API key"),
            Class::Inference if self.user.is_empty() => Ok(Caller::Anonymous),
            Class::Inference => self.need_key(p, "an API key"),
            Class::Admin => match &self.registry {
                RegistryMode::Open => Ok(Caller::Anonymous),
                RegistryMode::ReadOnly(why) if !self.any_key() => Err(forbidden(format!(
                    "the policy registry is read-only: {why}"
                ))),
                mode => match self.need_key(p, "the admin key")? {
                    c @ Caller::Admin(_) => Ok(c),
                    _ => Err(forbidden(match mode {
                        RegistryMode::ReadOnly(why) => {
                            format!("the policy registry is read-only: {why}")
                        }
                        _ => "this API key may run inference but not change the policy registry: upload and delete need the admin key".to_string(),
                    })),
                },
            },
        }
    }
}

fn unauthorized(m: String) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, m)
}

fn forbidden(m: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, m)
}

/// Middleware: the key rules, then the body limit from `Content-Length`.
/// Sets the [`Caller`] extension for the handlers.
pub async fn guard(
    axum::extract::State(state): axum::extract::State<State>,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path().to_string();
    let flavor = if path == "/v1" || path.starts_with("/v1/") {
        Flavor::OpenAi
    } else {
        Flavor::Ollama
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string());
    let class = class(req.method(), route.as_deref(), &path);
    let caller = match state.access.check(class, presented(&req)) {
        Ok(c) => c,
        Err(e) => {
            let mut r = e.flavor(flavor).into_response();
            if r.status() == StatusCode::UNAUTHORIZED {
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            return r;
        }
    };
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = length {
        let (limit, what) = if class == Class::Admin && req.method() == Method::POST {
            (
                state.policies.config().max_component_bytes as u64,
                "the component is {n} bytes, over the limit of {limit} bytes (policy_limits.max_component_bytes)",
            )
        } else {
            (
                state.limits.max_body_bytes as u64,
                "the request body is {n} bytes, over this server's limit of {limit} bytes (--max-body-bytes)",
            )
        };
        if n > limit {
            let m = what
                .replace("{n}", &n.to_string())
                .replace("{limit}", &limit.to_string());
            return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, m)
                .flavor(flavor)
                .into_response();
        }
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::config::Secret;

    fn access(user: &[&str], admin: Option<&str>, loopback: bool) -> Access {
        let cfg = AccessConfig {
            api_keys: user.iter().map(|k| Secret(k.to_string())).collect(),
            admin_key: admin.map(|k| Secret(k.to_string())),
            metrics_key_required: true,
        };
        Access::new(&cfg, loopback, "0.0.0.0:1")
    }

    fn key(k: &str) -> Presented {
        Presented::Key(k.to_string())
    }

    fn status(r: Result<Caller, ApiError>) -> u16 {
        match r {
            Ok(_) => 200,
            Err(e) => e.status.as_u16(),
        }
    }

    #[test]
    fn routes_fall_in_their_classes() {
        let c = |m: Method, route: Option<&str>, path: &str| class(&m, route, path);
        assert_eq!(
            c(Method::POST, Some("/api/policies"), "/api/policies"),
            Class::Admin
        );
        assert_eq!(
            c(Method::GET, Some("/api/policies"), "/api/policies"),
            Class::Inference
        );
        assert_eq!(
            c(
                Method::DELETE,
                Some("/api/policies/{name}"),
                "/api/policies/x"
            ),
            Class::Admin
        );
        assert_eq!(c(Method::GET, Some("/metrics"), "/metrics"), Class::Metrics);
        assert_eq!(c(Method::GET, Some("/health"), "/health"), Class::Open);
        assert_eq!(c(Method::GET, Some("/ui"), "/ui"), Class::Open);
        assert_eq!(c(Method::GET, None, "/v1/nope"), Class::Inference);
        assert_eq!(c(Method::GET, None, "/elsewhere"), Class::Open);
    }

    #[test]
    fn keys_and_statuses() {
        let a = access(&["u1", "u2"], Some("adm"), false);
        assert_eq!(a.registry, RegistryMode::AdminKey);
        for k in ["u1", "u2", "adm"] {
            assert_eq!(status(a.check(Class::Inference, key(k))), 200, "{k}");
            assert_eq!(status(a.check(Class::Metrics, key(k))), 200, "{k}");
        }
        assert_eq!(status(a.check(Class::Inference, Presented::None)), 401);
        assert_eq!(status(a.check(Class::Inference, Presented::Malformed)), 401);
        assert_eq!(status(a.check(Class::Inference, key("u3"))), 401);
        assert_eq!(status(a.check(Class::Inference, key("u"))), 401);
        assert_eq!(status(a.check(Class::Open, Presented::None)), 200);
        assert_eq!(status(a.check(Class::Admin, key("u1"))), 403);
        assert_eq!(status(a.check(Class::Admin, key("nope"))), 401);
        assert_eq!(status(a.check(Class::Admin, Presented::None)), 401);
        assert_eq!(
            a.check(Class::Admin, key("adm")).unwrap(),
            Caller::Admin(key_id("adm"))
        );
        assert_eq!(
            a.check(Class::Inference, key("u2")).unwrap(),
            Caller::User(key_id("u2"))
        );
        assert_eq!(key_id("adm").len(), 8);
        assert_ne!(key_id("u1"), key_id("u2"));

        // API keys, no admin key: read-only for everyone, and it says why
        let a = access(&["u1"], None, true);
        let e = a.check(Class::Admin, key("u1")).unwrap_err();
        assert_eq!(e.status.as_u16(), 403);
        assert!(e.message.contains("read-only"), "{}", e.message);
        assert_eq!(status(a.check(Class::Admin, Presented::None)), 401);

        // no keys: loopback is open, anything else read-only
        let a = access(&[], None, true);
        assert_eq!(a.registry, RegistryMode::Open);
        assert_eq!(status(a.check(Class::Admin, Presented::None)), 200);
        assert_eq!(status(a.check(Class::Inference, Presented::None)), 200);
        assert_eq!(status(a.check(Class::Metrics, Presented::None)), 200);
        let a = access(&[], None, false);
        let e = a.check(Class::Admin, key("anything")).unwrap_err();
        assert_eq!(e.status.as_u16(), 403);
        assert!(e.message.contains("not on loopback"), "{}", e.message);
        assert_eq!(status(a.check(Class::Inference, Presented::None)), 200);

        // only an admin key: inference stays open, the registry is keyed
        let a = access(&[], Some("adm"), false);
        assert_eq!(status(a.check(Class::Inference, Presented::None)), 200);
        assert_eq!(status(a.check(Class::Admin, Presented::None)), 401);
        assert_eq!(status(a.check(Class::Admin, key("adm"))), 200);
    }

    #[test]
    fn digests_compare_equal_only_when_equal() {
        let a = digest("k");
        assert!(ct_eq(&a, &digest("k")));
        let mut b = a;
        b[31] ^= 1;
        assert!(!ct_eq(&a, &b));
        b = a;
        b[0] ^= 0x80;
        assert!(!ct_eq(&a, &b));
    }
}
