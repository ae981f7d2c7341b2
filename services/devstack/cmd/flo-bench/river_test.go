package main

import (
	"testing"
	"time"
)

// The last lines of a `river bench --duration 30s` run of River v0.26.0.
const riverOutput = "bench: jobs worked [      54007 ], inserted [      50000 ], job/sec [    27003.5 ] [2s]\n" +
	"bench: total jobs worked [     757322 ], total jobs inserted [     830000 ], overall job/sec [    25244.4 ], running 29.999578306s\n"

func TestRiverResultReadsTheTotalLine(t *testing.T) {
	worked, took, err := riverResult([]byte(riverOutput))
	if err != nil {
		t.Fatal(err)
	}
	if worked != 757322 || took != 29999578306*time.Nanosecond {
		t.Fatalf("got %d jobs in %s, want 757322 in 29.999578306s", worked, took)
	}
}

func TestRiverResultWithoutATotalIsAnError(t *testing.T) {
	for _, out := range []string{
		"bench: jobs worked [      54007 ], inserted [      50000 ], job/sec [    27003.5 ] [2s]\n",
		"bench: total jobs worked [ 0 ], total jobs inserted [ 0 ], overall job/sec [ 0 ], running 30s\n",
		"",
	} {
		if worked, took, err := riverResult([]byte(out)); err == nil {
			t.Errorf("%q: got %d jobs in %s, want an error", out, worked, took)
		}
	}
}
