#pragma once

// The flags that say which data to train on (`--data`, `--skip-bad-samples`),
// shared by train and tune.

#include <CLI/CLI.hpp>

#include <string>

#include "batchtune/data/dataset.h"
#include "workload_flags.h"

namespace batchtune::cli {

struct DataFlags {
  std::string data = "synthetic";
  bool skip_bad_samples = false;
};

void add_data_flags(CLI::App& app, DataFlags& flags);

/// Opens the data; for real data the data decide `workload`'s input shape
/// and classes (an image folder takes its shape from `--input`). Throws
/// `batchtune::Error` naming the flag.
DataSplits open_data(const DataFlags& flags, WorkloadFlags& workload);

}  // namespace batchtune::cli
