#pragma once
// Deprecated forward (one release): use dtrain/fleet/sharding.h.
#include "dtrain/fleet/sharding.h"
#include "dtrain/torch/deprecated.h"
