//! The command lines as a user runs them: `kubectl maintenance` (the plugin and its shell
//! completion) and `maintenance-operator plan`; one test binary, each file a module.
//!
//! Apart from `e2e` because the plugin's rollout tests run operators of their own, one at a time,
//! on this binary's shared testbed (its `default` config never holds a test back); the other tests
//! here create requests there and read them back, with or without an operator at work.

mod completion;
mod kubectl_plugin;
mod plan_cli;
mod plugin_args_fuzz;
