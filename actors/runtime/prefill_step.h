// A prefill's step job on the compute thread (the layer worker decides when one runs,
// actors/runtime/layer_worker.cpp): the engine steps layer by layer while the loaders
// have delivered the next one, a due decode step runs between layers, and the work
// goes back to the worker in a stepped_atom message. PrefillWork is what the job and
// the worker hand to each other.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/runtime/actors.h"
#include "actors/runtime/decode_steps.h"
#include "actors/runtime/load_target.h"
#include "actors/runtime/trace.h"

namespace bs {

// What a prefill's step job works on: the engine run and what the job finds out. One
// owner at a time: the worker's task holds it while no job runs; the worker moves it
// into the job it submits, and the job hands it back in its stepped_atom message (as
// OTP hands state between processes). The worker never touches it while it is away
// (its task's `work` is empty then), the job never after it sent it.
struct PrefillWork {
  uint64_t id = 0;
  // Immutable: the worker makes a new plan to change it (the fallback).
  std::shared_ptr<const RequestPlan> plan;
  LoadTargetPtr target;  // the gate and copy events are thread-safe; the cache is the job's while it runs
  BatcherPtr batcher;    // the worker's: the decode steps due between this prefill's layers
  TracePtr trace;
  // The worker's cancel (a cancel_atom, the request's end): the one flag both sides
  // read while the job runs.
  std::shared_ptr<const std::atomic<bool>> cancelled;
  PrefillRun run;
  bool begun = false;
  // Tensor parallel: the next step job begins the prefill again on every rank, with
  // the plan it carries (the fallback after a stored entry failed).
  bool restart = false;
  // When the wait for the next layer began (the step's per-layer wait).
  std::chrono::steady_clock::time_point waiting_since;
  // Set by a step job that ended it: finished (`result` holds the prefill), or
  // failed with `error` (the gate is failed too, so the loaders stop). The worker
  // sets `error` too, for failures it finds (a timeout, a missing loader).
  bool finished = false;
  BlendPrefill result;
  std::string error;
  // Decode steps of other requests run between this prefill's layers, and their time.
  int64_t pauses = 0;
  double pause_seconds = 0;
  double collective_seconds = 0;  // tensor parallel: rank 0's waits in collectives
};

// The error of a prefill stopped by its cancel before its next layer.
std::string cancelled_before(const PrefillWork& t);

// The compute job of one prefill: steps while its next layer is delivered (the
// first job begins it), runs a due decode step between layers, and ends the
// prefill after its last layer. Stops at a cancel, a failed gate or an undelivered
// layer; the worker decides what comes next (stepped_atom).
void step_prefill(const WorkerEnv& env, const HandlesRef& h, PrefillWorkPtr t);

// A finished prefill's facts in its trace: per-layer waits and computes (from the
// prefill's own timings), how much of the load was hidden behind compute.
// fell_back: it began again after a stored entry failed.
void trace_prefill(const PrefillWork& work, bool fell_back);

}  // namespace bs
