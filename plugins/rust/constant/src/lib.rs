//! The `constant` schedule policy as a component (semantics: `specd_policy_logic::Constant`).
#![no_std]
extern crate alloc;

specd_policy_logic::schedule_component!(specd_policy_logic::Constant);
