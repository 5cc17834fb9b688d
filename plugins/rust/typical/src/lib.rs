//! The `typical` acceptance policy as a component (semantics: `specd_policy_logic::Typical`).
#![no_std]
extern crate alloc;

specd_policy_logic::acceptance_component!(specd_policy_logic::Typical);
