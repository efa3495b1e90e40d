// Range checks of the state a checkpoint's record carries beside its
// tensors (position, `--adapt`'s schedule, policy, noise and lr ramp, the
// token run's counts), as plan fields are checked: a hand edit or a record
// from another build is refused naming the file and the field, before the
// run divides by a micro-batch cap of -3 or ramps its lr from -1.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace batchtune {

/// Reads fields of one checkpoint's record; every failure an `OptionError`
/// about `--resume`: "PATH: field 'adapt.policy.micro_batch_cap' must be ...".
class CheckpointFields {
 public:
  explicit CheckpointFields(std::string path) : path_(std::move(path)) {}

  /// `json[name]`, an integer in [min, max]; `field` names it in errors.
  int64_t count(const nlohmann::json& json, const char* name, const std::string& field,
                int64_t min, int64_t max) const;
  /// `value` itself, an integer in [min, max].
  int64_t count(const nlohmann::json& value, const std::string& field, int64_t min,
                int64_t max) const;
  /// `json[name]`, a finite number in [min, max].
  double number(const nlohmann::json& json, const char* name, const std::string& field,
                double min, double max) const;
  /// `json[name]`, an array.
  const nlohmann::json& array(const nlohmann::json& json, const char* name,
                              const std::string& field) const;
  [[noreturn]] void fail(const std::string& field, const std::string& what) const;

 private:
  const nlohmann::json& at(const nlohmann::json& json, const char* name,
                           const std::string& field) const;
  std::string path_;
};

/// The position (`position.step`, `.epoch`, ...) of a checkpoint's record.
void check_position_fields(const nlohmann::json& position, const std::string& path);
/// A batch schedule's rows (`adapt.batch_schedule`).
void check_batch_schedule_fields(const nlohmann::json& schedule, const std::string& field,
                                 const CheckpointFields& fields);
/// `--adapt`'s state (`adapt`): schedule, policy, noise, lr ramp.
void check_adapt_fields(const nlohmann::json& adapt, const std::string& path);
/// The token run's state (`tokens`) of a data set of `samples` texts;
/// `fixed_without_target`: fixed batches with no token target (its
/// `target_tokens` is 0).
void check_token_fields(const nlohmann::json& tokens, const std::string& path, int64_t samples,
                        bool fixed_without_target);

}  // namespace batchtune
