// Warm standby workers. Starting a worker costs about 0.6 s here before main() even runs
// (loading libtorch and running its static initialisers), the largest part of a restart
// after a failure. With standby workers (`trireme run --standby`, on by default for
// `trireme train` with --max-restarts), the agent starts the next generation's workers
// ahead of time, with that generation's environment and TRIREME_STANDBY=1; each loads,
// then blocks in await_activation() until the agent needs it. A restart then activates
// them instead of starting processes.
//
// The handshake is the worker's stdin: a pipe from the agent instead of /dev/null. One
// byte activates the worker; EOF (the agent no longer needs it) makes it exit quietly.
#pragma once

namespace trireme::launch {

constexpr char kStandbyEnv[] = "TRIREME_STANDBY";

// In a worker, early in main(): returns at once unless this process was started as a
// standby; then blocks until the agent activates it, or exits 0 if the agent gives up on
// it. Programs run with `trireme run --standby` must call it before they make a
// dist::World (which refuses to start in a standby that has not awaited activation).
// What needs no world may come first, so that a restart does not wait for it: reading
// the data, a warm-up step of a small model (`trireme train`'s worker does both).
void await_activation();

// Whether this process is a standby that has not been activated (what World checks).
bool awaiting_activation();

}  // namespace trireme::launch
