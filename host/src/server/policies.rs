//! The policy registry over HTTP: list, upload (persisted to the policy
//! dir), remove.
use super::api::ApiError;
use super::State;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use specd_policy::RegistryError;
use std::collections::BTreeSet;

fn reg_err(e: RegistryError) -> ApiError {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    ApiError::new(status, e.to_string())
}

pub async fn list(axum::extract::State(state): axum::extract::State<State>) -> Json<Value> {
    let mut list = state.policies.list();
    list.sort_by(|a, b| (!a.builtin, &a.name).cmp(&(!b.builtin, &b.name)));
    Json(json!({
        "policies": list,
        "defaults": state.defaults,
        "limits": {
            "max_component_bytes": state.policies.config().max_component_bytes,
        },
    }))
}

#[derive(Deserialize)]
pub struct UploadQuery {
    name: Option<String>,
}

pub async fn upload(
    axum::extract::State(state): axum::extract::State<State>,
    Query(q): Query<UploadQuery>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let name = q.name.filter(|n| !n.is_empty()).ok_or_else(|| {
        ApiError::bad("the policy name is required: POST /api/policies?name=NAME")
    })?;
    let bytes = body.map_err(|e| {
        let limit = state.policies.config().max_component_bytes;
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                e.status(),
                format!("component refused: over the limit of {limit} bytes"),
            )
        } else {
            ApiError::new(
                e.status(),
                format!("cannot read the body: {}", e.body_text()),
            )
        }
    })?;
    if bytes.is_empty() {
        return Err(ApiError::bad(
            "the body is empty: send the component bytes (application/wasm)",
        ));
    }
    let host = state.policies.clone();
    let dir = state.policy_dir.clone();
    // Compiling a component takes milliseconds: off the async threads.
    let r = tokio::task::spawn_blocking(move || -> Result<Value, ApiError> {
        let info = host.add(&name, &bytes).map_err(reg_err)?;
        // Persist (write then rename: never a half-written file).
        let path = dir.join(format!("{name}.wasm"));
        let tmp = dir.join(format!(".{name}.wasm.tmp"));
        let persisted = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&tmp, &bytes))
            .and_then(|_| std::fs::rename(&tmp, &path));
        if let Err(e) = persisted {
            let _ = std::fs::remove_file(&tmp);
            let _ = host.remove(&name);
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot persist the policy to {}: {e}", path.display()),
            ));
        }
        Ok(json!({ "policy": info, "path": path.display().to_string() }))
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("upload task: {e}"),
        )
    })??;
    Ok((StatusCode::CREATED, Json(r)))
}

pub async fn remove(
    axum::extract::State(state): axum::extract::State<State>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let before: BTreeSet<String> = state
        .policies
        .list()
        .into_iter()
        .filter(|p| !p.builtin)
        .map(|p| p.name)
        .collect();
    state.policies.remove(&name).map_err(reg_err)?;
    let after: BTreeSet<String> = state.policies.list().into_iter().map(|p| p.name).collect();
    let removed: Vec<String> = before.difference(&after).cloned().collect();
    for n in &removed {
        let p = state.policy_dir.join(format!("{n}.wasm"));
        if p.exists() {
            if let Err(e) = std::fs::remove_file(&p) {
                tracing::warn!("cannot delete {}: {e}", p.display());
            }
        }
    }
    Ok(Json(json!({ "removed": removed })))
}
