#include "distributed/nccl_options.h"

#include <cstdlib>
#include <string>

namespace batchtune {
namespace {

bool truthy(const char* value) {
  const std::string v = value;
  return v == "1" || v == "true" || v == "TRUE" || v == "True" || v == "y" || v == "yes" ||
         v == "on" || v == "ON";
}

}  // namespace

bool prefer_nccl_blocking_wait(std::string* note) {
  for (const char* name : {"TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"}) {
    if (const char* value = std::getenv(name)) {
      const bool on = truthy(value);
      if (!on && note != nullptr) {
        *note = std::string(name) + "=" + value +
                ": a gone rank shows as NCCL's watchdog aborting the process, not as a named "
                "error; unset it for batchtune's diagnosis";
      }
      return on;
    }
  }
  setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  return true;
}

}  // namespace batchtune
