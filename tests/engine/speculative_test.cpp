// Speculative decoding on the CPU (the cases: speculative_cases.h).
#define KILN_SPEC_DEVICE "cpu"
#define KILN_SPEC_SUITE Speculative
#include "speculative_cases.h"
