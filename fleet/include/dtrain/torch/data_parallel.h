#pragma once
// Deprecated forward (one release): use dtrain/fleet/data_parallel.h.
#include "dtrain/fleet/data_parallel.h"
#include "dtrain/torch/deprecated.h"
