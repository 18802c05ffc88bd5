#pragma once
// Deprecated forward (one release): use dtrain/fleet/amp.h.
#include "dtrain/fleet/amp.h"
#include "dtrain/torch/deprecated.h"
