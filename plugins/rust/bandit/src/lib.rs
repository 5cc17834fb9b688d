//! The `bandit` schedule policy as a contract 0.2 component (semantics: `specd_policy_logic::Bandit`).
#![no_std]
extern crate alloc;

specd_policy_logic::schedule_component_v0_2!(specd_policy_logic::Bandit);
