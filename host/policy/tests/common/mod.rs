//! Shared test helpers: one PolicyHost per test binary, scripted inputs, and
//! hand-written components in the component text format (hostile or odd
//! policies built inside the tests).
#![allow(dead_code)]

pub mod ports;

use specd_policy::{HostConfig, PolicyHost, Position, RoundRecord, ScheduleInput};
use std::sync::OnceLock;

pub fn host() -> &'static PolicyHost {
    static HOST: OnceLock<PolicyHost> = OnceLock::new();
    HOST.get_or_init(|| PolicyHost::new(test_config()).expect("policy host"))
}

/// The default limits, with the compiled-component cache under the test
/// target directory (not the user's `$SPECD_HOME`).
pub fn test_config() -> HostConfig {
    HostConfig {
        cache_dir: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-cache")),
        ..HostConfig::default()
    }
}

/// The components build.rs produced (built-ins and test fixtures).
pub fn plugin_file(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("SPECD_PLUGINS_OUT")).join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn input(round: u32, max_draft: u32, recent: &[(u32, u32)]) -> ScheduleInput {
    ScheduleInput {
        round,
        generated: round * 2,
        budget_left: 1000,
        max_draft,
        recent: recent
            .iter()
            .map(|&(drafted, accepted)| RoundRecord {
                drafted,
                accepted,
                draft_seconds: 0.001,
                verify_seconds: 0.01,
            })
            .collect(),
        position_acceptance: vec![],
        draft_seconds_per_token: 0.0,
        verify_seconds_by_len: vec![],
        batch_sequences: 0,
        batch_rows_planned: 0,
    }
}

pub fn pos(token: u32, p: f32, q: f32, target_argmax: u32, entropy: f32, uniform: f32) -> Position {
    Position {
        token,
        p,
        q,
        target_argmax,
        entropy,
        uniform,
        ..Default::default()
    }
}

/// A tiny deterministic generator for scripted rounds.
pub struct Lcg(pub u64);
impl Lcg {
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    pub fn below(&mut self, n: u32) -> u32 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Pieces of a hand-written schedule component.  The core functions see the
/// canonical-ABI flattening of the WIT:
///   create(config_ptr, config_len, carried_is_some, carried_ptr, carried_len) -> retptr
///       (result<own<scheduler>, string> at retptr: tag u8 @0, handle/ptr @4, len @8)
///   next($self, $round, $generated, $budget, $max, recent_ptr, recent_len,
///        pa_ptr, pa_len, f64 draft_per_token, verify_ptr, verify_len) -> u32
///   carry($self) -> retptr (option<list<u8>>: tag u8 @0, ptr @4, len @8)
/// `$new` (resource.new) makes a handle.
pub struct ScheduleWat<'a> {
    /// The name the interface is exported under.
    pub export: &'a str,
    pub create: &'a str,
    pub next: &'a str,
    /// None: the `carry` method is left out of the export.
    pub carry: Option<&'a str>,
    /// Extra core module fields (start functions, ...).
    pub core_extra: &'a str,
    /// Extra component-level items (imports, ...), placed first.
    pub component_extra: &'a str,
}

pub const CREATE_OK: &str = "(i32.store8 (i32.const 64) (i32.const 0)) (i32.store (i32.const 68) (call $new (i32.const 1))) (i32.const 64)";
pub const CARRY_NONE: &str = "(i32.store8 (i32.const 96) (i32.const 0)) (i32.const 96)";

impl Default for ScheduleWat<'_> {
    fn default() -> Self {
        ScheduleWat {
            export: "specd:policy/schedule@0.1.0",
            create: CREATE_OK,
            next: "(i32.const 1)",
            carry: Some(CARRY_NONE),
            core_extra: "",
            component_extra: "",
        }
    }
}

/// The resource type `resource`, the core module `$main` instantiated with
/// its constructor, and its exports `create` and `method` aliased (both
/// hand-written components).
fn core_instance(resource: &str, method: &str) -> String {
    format!(
        r#"(type ${resource} (resource (rep i32)))
  (core func $rnew (canon resource.new ${resource}))
  (core instance $hostfns (export "[resource-new]{resource}" (func $rnew)))
  (core instance $m (instantiate $main (with "host" (instance $hostfns))))
  (alias core export $m "memory" (core memory $mem))
  (alias core export $m "cabi_realloc" (core func $realloc))
  (alias core export $m "create" (core func $c_create))
  (alias core export $m "{method}" (core func $c_{method}))"#
    )
}

const CORE_COMMON: &str = r#"
    (memory (export "memory") 1)
    (global $bump (mut i32) (i32.const 4096))
    (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
                             (i32.sub (i32.const 0) (local.get 2))))
      (global.set $bump (i32.add (local.get $p) (local.get 3)))
      (local.get $p))
"#;

impl ScheduleWat<'_> {
    pub fn wat(&self) -> String {
        let carry_core = self
            .carry
            .map(|b| format!("(func (export \"carry\") (param i32) (result i32) {b})"))
            .unwrap_or_default();
        let (carry_lift, carry_shim_import, carry_shim_export, carry_with) = if self.carry.is_some()
        {
            (
                r#"(type $fcarry (func (param "self" $borrow) (result $olu8)))
  (alias core export $m "carry" (core func $c_carry))
  (func $carry (type $fcarry) (canon lift (core func $c_carry) (memory $mem)))"#,
                r#"(type $i_fcarry (func (param "self" $i_borrow) (result $i_olu8)))
    (import "import-method-scheduler-carry" (func $i_carry (type $i_fcarry)))"#,
                r#"(type $e_fcarry (func (param "self" $e_borrow) (result $e_olu8)))
    (export "[method]scheduler.carry" (func $i_carry) (func (type $e_fcarry)))"#,
                r#"(with "import-method-scheduler-carry" (func $carry))"#,
            )
        } else {
            ("", "", "", "")
        };
        let instance = core_instance("scheduler", "next");
        format!(
            r#"(component
  {component_extra}
  (core module $main
    (import "host" "[resource-new]scheduler" (func $new (param i32) (result i32)))
    {CORE_COMMON}
    (func (export "create") (param i32 i32 i32 i32 i32) (result i32) {create})
    (func (export "next") (param $self i32) (param $round i32) (param $generated i32) (param $budget i32) (param $max i32)
      (param i32 i32 i32 i32 f64 i32 i32) (result i32) {next})
    {carry_core}
    {core_extra}
  )
  (type $rr (record (field "drafted" u32) (field "accepted" u32) (field "draft-seconds" float64) (field "verify-seconds" float64)))
  (type $lrr (list $rr))
  (type $lf (list float64))
  (type $si (record (field "round" u32) (field "generated" u32) (field "budget-left" u32) (field "max-draft" u32)
    (field "recent" $lrr) (field "position-acceptance" $lf) (field "draft-seconds-per-token" float64) (field "verify-seconds-by-len" $lf)))
  {instance}
  (type $lu8 (list u8))
  (type $olu8 (option $lu8))
  (type $own (own $scheduler))
  (type $res (result $own (error string)))
  (type $fcreate (func (param "config" string) (param "carried" $olu8) (result $res)))
  (func $create (type $fcreate) (canon lift (core func $c_create) (memory $mem) (realloc $realloc) string-encoding=utf8))
  (type $borrow (borrow $scheduler))
  (type $fnext (func (param "self" $borrow) (param "input" $si) (result u32)))
  (func $next (type $fnext) (canon lift (core func $c_next) (memory $mem) (realloc $realloc)))
  {carry_lift}
  (component $shim
    (import "import-type-scheduler" (type $i_sched (sub resource)))
    (type $i_lu8 (list u8))
    (type $i_olu8 (option $i_lu8))
    (type $i_own (own $i_sched))
    (type $i_res (result $i_own (error string)))
    (type $i_fcreate (func (param "config" string) (param "carried" $i_olu8) (result $i_res)))
    (import "import-static-scheduler-create" (func $i_create (type $i_fcreate)))
    (type $i_borrow (borrow $i_sched))
    (type $i_rr0 (record (field "drafted" u32) (field "accepted" u32) (field "draft-seconds" float64) (field "verify-seconds" float64)))
    (import "import-type-round-record" (type $i_rr (eq $i_rr0)))
    (type $i_lrr (list $i_rr))
    (type $i_lf (list float64))
    (type $i_si0 (record (field "round" u32) (field "generated" u32) (field "budget-left" u32) (field "max-draft" u32)
      (field "recent" $i_lrr) (field "position-acceptance" $i_lf) (field "draft-seconds-per-token" float64) (field "verify-seconds-by-len" $i_lf)))
    (import "import-type-schedule-input" (type $i_si (eq $i_si0)))
    (type $i_fnext (func (param "self" $i_borrow) (param "input" $i_si) (result u32)))
    (import "import-method-scheduler-next-draft-length" (func $i_next (type $i_fnext)))
    {carry_shim_import}
    (type $e_rr0 (record (field "drafted" u32) (field "accepted" u32) (field "draft-seconds" float64) (field "verify-seconds" float64)))
    (export $e_rr "round-record" (type $e_rr0))
    (type $e_lrr (list $e_rr))
    (type $e_lf (list float64))
    (type $e_si0 (record (field "round" u32) (field "generated" u32) (field "budget-left" u32) (field "max-draft" u32)
      (field "recent" $e_lrr) (field "position-acceptance" $e_lf) (field "draft-seconds-per-token" float64) (field "verify-seconds-by-len" $e_lf)))
    (export $e_si "schedule-input" (type $e_si0))
    (export $e_sched "scheduler" (type $i_sched))
    (type $e_lu8 (list u8))
    (type $e_olu8 (option $e_lu8))
    (type $e_own (own $e_sched))
    (type $e_res (result $e_own (error string)))
    (type $e_fcreate (func (param "config" string) (param "carried" $e_olu8) (result $e_res)))
    (export "[static]scheduler.create" (func $i_create) (func (type $e_fcreate)))
    (type $e_borrow (borrow $e_sched))
    (type $e_fnext (func (param "self" $e_borrow) (param "input" $e_si) (result u32)))
    (export "[method]scheduler.next-draft-length" (func $i_next) (func (type $e_fnext)))
    {carry_shim_export}
  )
  (instance $inst (instantiate $shim
    (with "import-static-scheduler-create" (func $create))
    (with "import-method-scheduler-next-draft-length" (func $next))
    {carry_with}
    (with "import-type-scheduler" (type $scheduler))
    (with "import-type-round-record" (type $rr))
    (with "import-type-schedule-input" (type $si))))
  (export "{export}" (instance $inst))
)"#,
            component_extra = self.component_extra,
            create = self.create,
            next = self.next,
            core_extra = self.core_extra,
            export = self.export,
        )
    }

    pub fn build(&self) -> Vec<u8> {
        let text = self.wat();
        wat::parse_str(&text)
            .unwrap_or_else(|e| panic!("test component does not assemble: {e}\n{text}"))
    }
}

/// A hand-written acceptance component.  Core functions:
///   create(config_ptr, config_len, vocab_size) -> retptr (result<own<acceptor>, string>)
///   decide($self, positions_ptr, positions_len) -> retptr
///       (decision: accepted u32 @0, correction tag u8 @4, token u32 @8)
/// Each position is 24 bytes: token, p, q, target-argmax, entropy, uniform.
pub struct AcceptanceWat<'a> {
    pub create: &'a str,
    pub decide: &'a str,
}

pub const ACCEPT_CREATE_OK: &str = CREATE_OK;

impl AcceptanceWat<'_> {
    pub fn build(&self) -> Vec<u8> {
        let instance = core_instance("acceptor", "decide");
        let text = format!(
            r#"(component
  (core module $main
    (import "host" "[resource-new]acceptor" (func $new (param i32) (result i32)))
    {CORE_COMMON}
    (func (export "create") (param i32 i32 i32) (result i32) {create})
    (func (export "decide") (param $self i32) (param $ptr i32) (param $len i32) (result i32) {decide})
  )
  {instance}
  (type $pos (record (field "token" u32) (field "p" float32) (field "q" float32) (field "target-argmax" u32) (field "entropy" float32) (field "uniform" float32)))
  (type $corr (variant (case "residual") (case "target-sample") (case "token" u32)))
  (type $dec (record (field "accepted" u32) (field "correction" $corr)))
  (type $own (own $acceptor))
  (type $res (result $own (error string)))
  (type $fcreate (func (param "config" string) (param "vocab-size" u32) (result $res)))
  (func $create (type $fcreate) (canon lift (core func $c_create) (memory $mem) (realloc $realloc) string-encoding=utf8))
  (type $borrow (borrow $acceptor))
  (type $lpos (list $pos))
  (type $fdecide (func (param "self" $borrow) (param "positions" $lpos) (result $dec)))
  (func $decide (type $fdecide) (canon lift (core func $c_decide) (memory $mem) (realloc $realloc)))
  (component $shim
    (import "import-type-acceptor" (type $i_acc (sub resource)))
    (type $i_own (own $i_acc))
    (type $i_res (result $i_own (error string)))
    (type $i_fcreate (func (param "config" string) (param "vocab-size" u32) (result $i_res)))
    (import "import-static-acceptor-create" (func $i_create (type $i_fcreate)))
    (type $i_borrow (borrow $i_acc))
    (type $i_pos0 (record (field "token" u32) (field "p" float32) (field "q" float32) (field "target-argmax" u32) (field "entropy" float32) (field "uniform" float32)))
    (import "import-type-position" (type $i_pos (eq $i_pos0)))
    (type $i_lpos (list $i_pos))
    (type $i_corr0 (variant (case "residual") (case "target-sample") (case "token" u32)))
    (import "import-type-correction" (type $i_corr (eq $i_corr0)))
    (type $i_dec0 (record (field "accepted" u32) (field "correction" $i_corr)))
    (import "import-type-decision" (type $i_dec (eq $i_dec0)))
    (type $i_fdecide (func (param "self" $i_borrow) (param "positions" $i_lpos) (result $i_dec)))
    (import "import-method-acceptor-decide" (func $i_decide (type $i_fdecide)))
    (type $e_pos0 (record (field "token" u32) (field "p" float32) (field "q" float32) (field "target-argmax" u32) (field "entropy" float32) (field "uniform" float32)))
    (export $e_pos "position" (type $e_pos0))
    (type $e_corr0 (variant (case "residual") (case "target-sample") (case "token" u32)))
    (export $e_corr "correction" (type $e_corr0))
    (type $e_dec0 (record (field "accepted" u32) (field "correction" $e_corr)))
    (export $e_dec "decision" (type $e_dec0))
    (export $e_acc "acceptor" (type $i_acc))
    (type $e_own (own $e_acc))
    (type $e_res (result $e_own (error string)))
    (type $e_fcreate (func (param "config" string) (param "vocab-size" u32) (result $e_res)))
    (export "[static]acceptor.create" (func $i_create) (func (type $e_fcreate)))
    (type $e_borrow (borrow $e_acc))
    (type $e_lpos (list $e_pos))
    (type $e_fdecide (func (param "self" $e_borrow) (param "positions" $e_lpos) (result $e_dec)))
    (export "[method]acceptor.decide" (func $i_decide) (func (type $e_fdecide)))
  )
  (instance $inst (instantiate $shim
    (with "import-static-acceptor-create" (func $create))
    (with "import-method-acceptor-decide" (func $decide))
    (with "import-type-acceptor" (type $acceptor))
    (with "import-type-position" (type $pos))
    (with "import-type-correction" (type $corr))
    (with "import-type-decision" (type $dec))))
  (export "specd:policy/acceptance@0.1.0" (instance $inst))
)"#,
            create = self.create,
            decide = self.decide,
        );
        wat::parse_str(&text)
            .unwrap_or_else(|e| panic!("test component does not assemble: {e}\n{text}"))
    }
}

/// Runs random requests through a port of `heuristic` and the built-in side
/// by side (same configs, models and outcomes: a full accept half the time,
/// else a random partial) and asserts they answer alike every round and carry
/// the same state after every request.  `rounds` draws each request's round
/// count.  Returns the rounds compared.
#[allow(dead_code)] // not every test binary compares a port
pub fn assert_heuristic_twin(
    twin: &str,
    requests: u32,
    seed: u64,
    rounds: impl Fn(&mut Lcg) -> u32,
) -> u32 {
    let mut rng = Lcg(seed);
    let configs = [
        "{}",
        r#"{"initial": 1}"#,
        r#"{"initial":7}"#,
        r#"{"initial": 40}"#,
    ];
    let mut total = 0;
    for request in 0..requests {
        let config = configs[(request % 4) as usize];
        let model = format!("{twin}-twin-{}", request % 3);
        let mut t = host().schedule(twin, config, &model).unwrap();
        let mut r = host().schedule("heuristic", config, &model).unwrap();
        let mut recent: Vec<(u32, u32)> = Vec::new();
        for round in 0..rounds(&mut rng) {
            let max = rng.below(17); // 0..=16, 0 included
            let i = input(round, max, &recent);
            let (kt, kr) = (
                t.next_draft_length(&i).unwrap(),
                r.next_draft_length(&i).unwrap(),
            );
            assert_eq!(
                kt, kr,
                "{twin}: request {request} round {round} config {config}"
            );
            let accepted = if rng.below(2) == 0 {
                kr
            } else {
                rng.below(kr + 1)
            };
            recent.push((kr, accepted));
            total += 1;
        }
        // both carry k (4 little-endian bytes), each under its own hash
        t.finish();
        r.finish();
        let carried = host().carried_state(twin, &model, config);
        assert!(carried.as_ref().is_some_and(|c| c.len() == 4), "{twin}");
        assert_eq!(
            carried,
            host().carried_state("heuristic", &model, config),
            "{twin}: carried state after request {request}"
        );
    }
    total
}

/// Random positions, with the edge cases of `uniform * q >= p` in f32: p = 0,
/// q = 0, p exactly the f32 product and its neighbours.
pub fn random_position(rng: &mut Lcg) -> Position {
    let unit = |rng: &mut Lcg| rng.below(1 << 24) as f32 / (1u32 << 24) as f32;
    let uniform = unit(rng);
    let q = match rng.below(8) {
        0 => 0.0,
        1 => 1.0,
        _ => unit(rng),
    };
    let product = uniform * q;
    let p = match rng.below(10) {
        0 => 0.0,
        1 => product,
        2 => product.next_up(),
        3 => product.next_down().max(0.0),
        // just above and below the exact (f64) product
        4 => ((uniform as f64 * q as f64) * (1.0 + 1e-9)) as f32,
        5 => ((uniform as f64 * q as f64) * (1.0 - 1e-9)) as f32,
        _ => unit(rng),
    };
    let token = rng.below(50_000);
    pos(token, p, q, token, 1.0, uniform)
}
