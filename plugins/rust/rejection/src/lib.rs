//! The `rejection` acceptance policy as a component (semantics: `specd_policy_logic::Rejection`).
#![no_std]
extern crate alloc;

specd_policy_logic::acceptance_component!(specd_policy_logic::Rejection);
