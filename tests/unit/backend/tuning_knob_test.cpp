// tuning_knob (backend/cuda/tuning_knob.h), the reader behind the CUDA launchers' A/B settings
// (PAGELLM_DECODE_MIN_CHUNK, PAGELLM_MOE_GEMV_SPLIT, ...): host code only, so it is tested here on
// the CPU. A setting is taken only when the launcher's check accepts it; anything else leaves the
// default in place.
#include "backend/cuda/tuning_knob.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace pagellm::cuda {
namespace {

bool split_ok(int64_t v) {
  return v == 1 || v == 2 || v == 4;
}

TEST(TuningKnob, UnsetGivesTheDefault) {
  unsetenv("PAGELLM_TEST_KNOB_UNSET");
  EXPECT_EQ(tuning_knob("PAGELLM_TEST_KNOB_UNSET", 64, split_ok), 64);
}

TEST(TuningKnob, AcceptedValueIsTaken) {
  setenv("PAGELLM_TEST_KNOB_OK", "4", 1);
  EXPECT_EQ(tuning_knob("PAGELLM_TEST_KNOB_OK", 0, split_ok), 4);
  setenv("PAGELLM_TEST_KNOB_OK", "96", 1);
  EXPECT_EQ(tuning_knob("PAGELLM_TEST_KNOB_OK", 64,
                        [](int64_t c) { return c >= 32 && c <= 1024 && c % 32 == 0; }),
            96);
  unsetenv("PAGELLM_TEST_KNOB_OK");
}

TEST(TuningKnob, RejectedValueGivesTheDefault) {
  for (const char* bad : {"3", "0", "-2", "abc", "", "99999999999999999999"}) {
    setenv("PAGELLM_TEST_KNOB_BAD", bad, 1);
    EXPECT_EQ(tuning_knob("PAGELLM_TEST_KNOB_BAD", 8, split_ok), 8) << "value '" << bad << "'";
  }
  unsetenv("PAGELLM_TEST_KNOB_BAD");
}

}  // namespace
}  // namespace pagellm::cuda
