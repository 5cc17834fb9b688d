//! The `throughput` schedule policy as a contract 0.2 component (it reads the batch context) (semantics: `specd_policy_logic::Throughput`).
#![no_std]
extern crate alloc;

specd_policy_logic::schedule_component_v0_2!(specd_policy_logic::Throughput);
