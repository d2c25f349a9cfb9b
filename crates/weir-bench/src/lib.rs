//! `weir bench`: an open-loop load generator against Weir itself (and its baselines).
//!
//! Modelled on pagebench: every client has a schedule, request `k` is due at a fixed time, and
//! latency is measured from that due time, so a slow target cannot hide the queueing it causes
//! (no coordinated omission). A request whose slot has passed before the client could send it
//! is not sent late: it is counted as MISSED, which is what an open-loop caller would have seen
//! as lost capacity.
//!
//! - [`schedule`]: when each request is due (steady or bursty) and which were missed;
//! - [`pacer`]: wakes each client when its next request is due;
//! - [`keys`]: which key a request uses (uniform or zipf);
//! - [`progress`]: a live line a second while a run goes, kept as a timeline;
//! - [`plot`]: the timeline as an SVG chart;
//! - [`report`]: counts and the latency histogram, merged across clients, and their rendering;
//! - [`run`]: a run's settings and the client loops;
//! - [`targets`]: what a run measures, a file per target (in-process, HTTP, gRPC, gRPC stream,
//!   Redis, round robin) behind one trait;
//! - [`redis`]: the Redis baseline's Lua scripts;
//! - [`floor`]: a bare axum endpoint and a bare tonic service, the floor Weir's front doors
//!   are measured against;
//! - [`nodes`]: local `weir serve` processes a scenario starts and stops;
//! - [`scenario`]: the named experiments.

pub mod floor;
pub mod keys;
pub mod nodes;
pub mod pacer;
pub mod plot;
pub mod progress;
pub mod redis;
pub mod report;
pub mod run;
pub mod scenario;
pub mod schedule;
pub mod targets;
