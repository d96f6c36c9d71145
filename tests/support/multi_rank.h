// Shared helpers for multi-rank tests: run N ranks as threads with a bounded wait, pick free
// loopback ports.
//
// Thread safety: runRanks() is called from the test's main thread; the body runs once per rank
// on its own thread and must not touch gtest assertions' fatal paths from outside the test
// thread (use the returned per-rank strings to report failures).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace bagua::testing {

// Runs body(rank) on `n` threads and joins them. Returns one message per rank: empty when the
// rank's body returned empty. A rank still running after `timeout` is reported as hung (its
// thread is detached so the test fails instead of hanging; the process should then exit).
std::vector<std::string> runRanks(int n, const std::function<std::string(int rank)>& body,
                                  std::chrono::milliseconds timeout);

// Joins the non-empty messages of runRanks() into one failure text ("" when all passed).
std::string joinFailures(const std::vector<std::string>& perRank);

// A TCP port on 127.0.0.1 that was free a moment ago (bound and released).
int freeLoopbackPort();

}  // namespace bagua::testing
