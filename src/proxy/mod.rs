//! The proxy: route table and keys, the holder decision, forwarding and the
//! tower layers.

pub mod routes;
