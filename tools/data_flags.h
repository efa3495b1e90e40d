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

/// For `--data text:DIR`: refuses an `--input` that is no token input
/// before anything else blames another flag for it (`--vocab`).
void check_text_inputs(const DataFlags& flags, const WorkloadFlags& workload);

/// The folder `--data` reads (fashion-mnist's, an image folder, text:DIR),
/// for `check_file_roles`; an empty path for synthetic data.
FileRole data_file_role(const DataFlags& flags);

}  // namespace batchtune::cli
