//! The policy registry over HTTP: list, upload (persisted to the policy
//! dir, with a record of who uploaded it and when), remove.  Who may upload
//! and delete is decided before these handlers run ([`super::access`]);
//! here: the quotas, the component size limit and the concurrent uploads.
use super::access::Caller;
use super::api::ApiError;
use super::State;
use axum::extract::{Path, Query, Request};
use axum::http::StatusCode;
use axum::Json;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use specd_policy::{PolicyInfo, PolicySource, RegistryError, RegistryQuota};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::PoisonError;

fn reg_err(e: RegistryError) -> ApiError {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    let hint = match e {
        RegistryError::Quota(_) => {
            " (--registry-max-policies / --registry-max-bytes); delete a policy first"
        }
        _ => "",
    };
    ApiError::new(status, format!("{e}{hint}"))
}

/// Who uploaded a policy, and when; kept beside it as `NAME.upload.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UploadRecord {
    /// RFC 3339, UTC.
    pub uploaded_at: String,
    /// The id of the key that uploaded it (first 8 hex digits of its
    /// sha256); `None` when no key was needed.
    pub key_id: Option<String>,
    /// The component's sha256 (a record of other bytes is stale).
    pub sha256: String,
}

fn record_path(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}.upload.json"))
}

/// The records of the policies loaded from `dir` at start.
pub fn load_records(dir: &std::path::Path, infos: &[PolicyInfo]) -> BTreeMap<String, UploadRecord> {
    infos
        .iter()
        .filter(|p| matches!(&p.source, PolicySource::File(f) if f.parent() == Some(dir)))
        .filter_map(|p| {
            let text = std::fs::read_to_string(record_path(dir, &p.name)).ok()?;
            let r: UploadRecord = serde_json::from_str(&text).ok()?;
            (r.sha256 == p.sha256).then(|| (p.name.clone(), r))
        })
        .collect()
}

fn records(state: &State) -> std::sync::MutexGuard<'_, BTreeMap<String, UploadRecord>> {
    state.uploads.lock().unwrap_or_else(PoisonError::into_inner)
}

pub async fn list(axum::extract::State(state): axum::extract::State<State>) -> Json<Value> {
    let mut list = state.policies.list();
    list.sort_by(|a, b| (!a.builtin, &a.name).cmp(&(!b.builtin, &b.name)));
    let recs = match &state.store {
        // Who uploaded what is the store's, shared by every replica.
        Some(store) => store
            .entries()
            .unwrap_or_default()
            .into_iter()
            .map(|(n, e)| {
                let r = UploadRecord {
                    uploaded_at: e.uploaded_at,
                    key_id: e.key_id,
                    sha256: e.sha256,
                };
                (n, r)
            })
            .collect(),
        None => records(&state).clone(),
    };
    let policies: Vec<Value> = list
        .into_iter()
        .map(|p| {
            let rec = recs.get(&p.name).filter(|r| r.sha256 == p.sha256).cloned();
            let builtin = p.builtin;
            let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
            if let (Some(o), false) = (v.as_object_mut(), builtin) {
                o.insert(
                    "uploaded_at".into(),
                    json!(rec.as_ref().map(|r| r.uploaded_at.clone())),
                );
                o.insert("uploaded_by".into(), json!(rec.and_then(|r| r.key_id)));
            }
            v
        })
        .collect();
    let (count, bytes) = match &state.store {
        Some(store) => store
            .usage("")
            .map(|(c, b)| (c, b as usize))
            .unwrap_or_default(),
        None => {
            let (c, b) = state.policies.user_usage();
            (c, b as usize)
        }
    };
    let l = &state.limits;
    Json(json!({
        "policies": policies,
        "defaults": state.defaults,
        "registry": match &state.access.registry {
            super::access::RegistryMode::Open => json!({"mode": "open"}),
            super::access::RegistryMode::AdminKey => json!({"mode": "admin_key"}),
            super::access::RegistryMode::ReadOnly(why) => json!({"mode": "read_only", "reason": why}),
        },
        "limits": {
            "max_component_bytes": state.policies.config().max_component_bytes,
            "registry_max_policies": l.registry_max_policies,
            "registry_max_bytes": l.registry_max_bytes,
            "max_concurrent_uploads": l.max_concurrent_uploads,
        },
        "usage": { "policies": count, "bytes": bytes },
    }))
}

/// Counts an upload in flight while alive.
struct InFlight(State);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.metrics.uploads_in_flight.fetch_sub(1, Relaxed);
    }
}

#[derive(Deserialize)]
pub struct UploadQuery {
    name: Option<String>,
}

pub async fn upload(
    axum::extract::State(state): axum::extract::State<State>,
    Query(q): Query<UploadQuery>,
    req: Request,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let name = q.name.filter(|n| !n.is_empty()).ok_or_else(|| {
        ApiError::bad("the policy name is required: POST /api/policies?name=NAME")
    })?;
    let caller = req
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or(Caller::Anonymous);
    // Compiling a large component takes seconds of CPU: a few at a time.
    let permit = state.upload_slots.clone().try_acquire_owned().map_err(|_| {
        state.metrics.uploads_refused_busy.fetch_add(1, Relaxed);
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many policy uploads at once (at most {}, --max-concurrent-uploads); retry later",
                state.limits.max_concurrent_uploads
            ),
        )
    })?;
    state.metrics.uploads_in_flight.fetch_add(1, Relaxed);
    let in_flight = InFlight(state.clone());
    let limit = state.policies.config().max_component_bytes;
    let mut bytes = Vec::new();
    let mut body = req.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad(format!("cannot read the body: {e}")))?;
        if bytes.len() + chunk.len() > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "component refused: over the limit of {limit} bytes (policy_limits.max_component_bytes)"
                ),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    if bytes.is_empty() {
        return Err(ApiError::bad(
            "the body is empty: send the component bytes (application/wasm)",
        ));
    }
    let quota = RegistryQuota {
        max_policies: state.limits.registry_max_policies,
        max_bytes: state.limits.registry_max_bytes,
    };
    let st = state.clone();
    // Compiling takes milliseconds to seconds: off the async threads.
    let r = tokio::task::spawn_blocking(move || -> Result<Value, ApiError> {
        let _held = (permit, in_flight);
        if let Some(store) = &st.store {
            return upload_to_store(&st, store, &name, &bytes, &quota, &caller);
        }
        let host = &st.policies;
        let dir = &st.policy_dir;
        let info = host.add_within(&name, &bytes, &quota).map_err(reg_err)?;
        // Persist (write then rename: never a half-written file).
        let path = dir.join(format!("{name}.wasm"));
        let tmp = dir.join(format!(".{name}.wasm.tmp"));
        let persisted = std::fs::create_dir_all(dir)
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
        let record = UploadRecord {
            uploaded_at: super::api::now_rfc3339(),
            key_id: caller.key_id().map(str::to_string),
            sha256: info.sha256.clone(),
        };
        let rp = record_path(dir, &name);
        let rtmp = dir.join(format!(".{name}.upload.json.tmp"));
        let text = serde_json::to_string_pretty(&record).unwrap_or_default();
        if let Err(e) = std::fs::write(&rtmp, text).and_then(|_| std::fs::rename(&rtmp, &rp)) {
            let _ = std::fs::remove_file(&rtmp);
            tracing::warn!("cannot write {}: {e}", rp.display());
        }
        records(&st).insert(name.clone(), record.clone());
        tracing::info!(policy = %name, sha256 = %info.sha256, key_id = ?record.key_id, "policy uploaded");
        let mut policy = serde_json::to_value(&info).unwrap_or(Value::Null);
        if let Some(o) = policy.as_object_mut() {
            o.insert("uploaded_at".into(), json!(record.uploaded_at));
            o.insert("uploaded_by".into(), json!(record.key_id));
        }
        Ok(json!({ "policy": policy, "path": path.display().to_string() }))
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

/// An upload with `--policy-store`: the quotas count the shared store; the
/// component is checked and compiled here, then becomes what the name means
/// for every replica (they pick it up at their next sync).
fn upload_to_store(
    st: &State,
    store: &specd_policy::PolicyStore,
    name: &str,
    bytes: &[u8],
    quota: &RegistryQuota,
    caller: &Caller,
) -> Result<Value, ApiError> {
    let store_err = |e: std::io::Error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the policy store {}: {e}", store.dir().display()),
        )
    };
    let (count, total) = store.usage(name).map_err(store_err)?;
    if count + 1 > quota.max_policies || total + bytes.len() as u64 > quota.max_bytes {
        return Err(reg_err(RegistryError::Quota(format!(
            "the shared store holds {count} other policies of {total} bytes; this one ({} bytes) would pass {} policies / {} bytes",
            bytes.len(),
            quota.max_policies,
            quota.max_bytes
        ))));
    }
    let info = st
        .policies
        .add_from(name, bytes, PolicySource::Store)
        .map_err(reg_err)?;
    let entry = specd_policy::StoreEntry {
        sha256: info.sha256.clone(),
        uploaded_at: super::api::now_rfc3339(),
        key_id: caller.key_id().map(str::to_string),
    };
    store.put(name, bytes, &entry).map_err(store_err)?;
    tracing::info!(policy = %name, sha256 = %info.sha256, key_id = ?entry.key_id, "policy uploaded to the shared store");
    let mut policy = serde_json::to_value(&info).unwrap_or(Value::Null);
    if let Some(o) = policy.as_object_mut() {
        o.insert("uploaded_at".into(), json!(entry.uploaded_at));
        o.insert("uploaded_by".into(), json!(entry.key_id));
    }
    Ok(json!({ "policy": policy, "store": store.dir().display().to_string() }))
}

/// A delete with `--policy-store`: the names go from the store (every
/// replica drops them at its next sync) and from this replica now.
fn remove_from_store(
    state: &State,
    store: &specd_policy::PolicyStore,
    name_or_hash: &str,
) -> Result<Vec<String>, ApiError> {
    let entries = store.entries().map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the policy store: {e}"),
        )
    })?;
    let hash = name_or_hash
        .strip_prefix("sha256:")
        .unwrap_or(name_or_hash)
        .to_ascii_lowercase();
    let names: Vec<String> = if entries.contains_key(name_or_hash) {
        vec![name_or_hash.to_string()]
    } else if hash.len() >= 8 && hash.chars().all(|c| c.is_ascii_hexdigit()) {
        entries
            .iter()
            .filter(|(_, e)| e.sha256.starts_with(&hash))
            .map(|(n, _)| n.clone())
            .collect()
    } else {
        Vec::new()
    };
    if names.is_empty() {
        // A built-in or a local file policy: as without a store.
        state.policies.remove(name_or_hash).map_err(reg_err)?;
        return Ok(vec![name_or_hash.to_string()]);
    }
    for n in &names {
        store.delete(n).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the policy store: {e}"),
            )
        })?;
        let _ = state.policies.remove(n);
        state.policies.remove_pins(n);
    }
    Ok(names)
}

pub async fn remove(
    axum::extract::State(state): axum::extract::State<State>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if let Some(store) = &state.store {
        let removed = remove_from_store(&state, store, &name)?;
        return Ok(Json(json!({ "removed": removed })));
    }
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
        records(&state).remove(n);
        for p in [
            state.policy_dir.join(format!("{n}.wasm")),
            record_path(&state.policy_dir, n),
        ] {
            if p.exists() {
                if let Err(e) = std::fs::remove_file(&p) {
                    tracing::warn!("cannot delete {}: {e}", p.display());
                }
            }
        }
    }
    Ok(Json(json!({ "removed": removed })))
}
