#pragma once

// Every view of a finished or running tune (`TuneResult`), for callers that
// want them all: its JSON, its console tables, its HTML page and the
// reporters that write them as the tune goes.

#include "batchtune/reports/tune_console.h"
#include "batchtune/reports/tune_json.h"
#include "batchtune/reports/tune_page.h"
#include "batchtune/reports/tune_reporters.h"
