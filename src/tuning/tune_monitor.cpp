// What the tune read of the device while it ran: the utilization timeline
// and, in a short note and in full, what the sampler could not read.
#include "batchtune/memory/device_memory.h"
#include "batchtune/monitoring/monitor.h"
#include "batchtune/monitoring/sampler.h"
#include "tune_pipeline.h"

namespace batchtune {

void TunePipeline::finish_monitor() {
  Monitor* monitor = options_.monitor();
  TuneResult& r = result_;
  if (monitor == nullptr) {
    r.utilization_note = "utilization not monitored";
    return;
  }
  monitor->stop();
  const double start = monitor_start_s_;
  for (const auto& sample : monitor->samples()) {
    // Readings from before the tune began (the monitor may have started
    // earlier) would put the timeline's start below 0.
    if (sample.device == r.device && sample.time_s >= start) {
      r.timeline.push_back({sample.time_s - start, sample.utilization_percent});
    }
  }
  // One short line on the console; the reasons (~400 characters of NVML
  // and RAPL errors) go to utilization_details.
  r.utilization_details = monitor->sampler().describe();
  r.utilization_note = r.utilization_details;
  const std::string missing = monitor->sampler().unavailable_reason();
  if (!missing.empty()) {
    r.utilization_details += "; n/a: " + missing;
    r.utilization_note += "; n/a: " + missing.substr(0, missing.find(": "));
  }
  if (memory_.device().is_cpu()) {
    r.utilization_details += "; GPU utilization unavailable: " + gpu_unavailable_reason();
    r.utilization_note += "; no GPU";
  }
  if (r.utilization_note != r.utilization_details) {
    r.utilization_note += options_.front_end() == FrontEnd::kCli
                              ? " (why: utilization_details in --json)"
                              : " (why: utilization_details in to_dict())";
  }
}

}  // namespace batchtune
