//! The acceptance rules ([`AcceptanceLogic`](crate::AcceptanceLogic)
//! implementations), one file each.

mod greedy;
mod rejection;
mod typical;

pub use greedy::Greedy;
pub use rejection::Rejection;
pub use typical::Typical;
