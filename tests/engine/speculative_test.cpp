// Speculative decoding on the CPU (the cases: speculative_cases.h).
#define KILN_SPEC_DEVICE "cpu"
#include "speculative_cases.h"
