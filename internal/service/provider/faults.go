package provider

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultTimeoutHold is how long a timeout fault holds the answer when
// Faults.TimeoutHold is zero: longer than any sane client timeout, so the
// client is the one that gives up, as it would with a hung provider.
const DefaultTimeoutHold = 30 * time.Second

// Faults are the failures the sandbox injects into POST /v1/charges and
// POST /v1/refunds alike, at the same steps (never into the GET endpoints,
// which tests use to observe what happened). Each rate is a probability in
// [0, 1], rolled independently per request.
type Faults struct {
	// FailRate answers 500 before anything is charged or refunded: the safe
	// failure.
	FailRate float64
	// TimeoutRate stores the charge or refund (or finds the replay), then
	// loses the answer: the handler holds it until the client gives up or
	// TimeoutHold passes, then drops the connection. The dangerous case for
	// a caller: charged or refunded, but told nothing.
	TimeoutRate float64
	// TimeoutHold bounds a timeout fault's hold; zero means DefaultTimeoutHold.
	TimeoutHold time.Duration
	// Latency is added before each POST is processed.
	Latency time.Duration
	// DeclineRate declines new charges and refunds. A declined one is stored
	// like any other, so its replays are declined too; a declined refund
	// does not count against its charge's amount.
	DeclineRate float64
	// Seed seeds the dice so a run's faults can be reproduced; zero seeds
	// from the clock.
	Seed int64
}

// Validate reports the first fault setting out of range.
func (f Faults) Validate() error {
	for _, r := range []struct {
		name string
		v    float64
	}{{"fail rate", f.FailRate}, {"timeout rate", f.TimeoutRate}, {"decline rate", f.DeclineRate}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("%s %v is outside [0, 1]", r.name, r.v)
		}
	}
	if f.TimeoutHold < 0 {
		return fmt.Errorf("timeout hold %v is negative", f.TimeoutHold)
	}
	if f.Latency < 0 {
		return fmt.Errorf("latency %v is negative", f.Latency)
	}
	return nil
}

// The environment variables FaultsFromEnv reads. cmd/fakeprovider takes
// them as flag defaults and Oncekey's serve for its in-process sandbox, so
// one setting works for both.
const (
	EnvFailRate    = "FAKEPROVIDER_FAIL_RATE"
	EnvTimeoutRate = "FAKEPROVIDER_TIMEOUT_RATE"
	EnvTimeoutHold = "FAKEPROVIDER_TIMEOUT_HOLD"
	EnvLatency     = "FAKEPROVIDER_LATENCY"
	EnvDeclineRate = "FAKEPROVIDER_DECLINE_RATE"
	EnvSeed        = "FAKEPROVIDER_SEED"
)

// FaultsFromEnv reads the FAKEPROVIDER_* fault variables through getenv
// (os.Getenv, or a map in tests). Unset or empty variables keep the zero
// value, no fault; a malformed or out-of-range one is an error naming it,
// since a typo silently meaning "no faults" would make a chaos test pass
// for the wrong reason.
func FaultsFromEnv(getenv func(string) string) (Faults, error) {
	var f Faults
	rates := []struct {
		name string
		dst  *float64
	}{{EnvFailRate, &f.FailRate}, {EnvTimeoutRate, &f.TimeoutRate}, {EnvDeclineRate, &f.DeclineRate}}
	for _, r := range rates {
		s := strings.TrimSpace(getenv(r.name))
		if s == "" {
			continue
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(v) || v < 0 || v > 1 {
			return Faults{}, fmt.Errorf("%s=%q: want a number in [0, 1]", r.name, s)
		}
		*r.dst = v
	}
	durations := []struct {
		name string
		dst  *time.Duration
	}{{EnvTimeoutHold, &f.TimeoutHold}, {EnvLatency, &f.Latency}}
	for _, d := range durations {
		s := strings.TrimSpace(getenv(d.name))
		if s == "" {
			continue
		}
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 {
			return Faults{}, fmt.Errorf("%s=%q: want a non-negative duration such as 250ms", d.name, s)
		}
		*d.dst = v
	}
	if s := strings.TrimSpace(getenv(EnvSeed)); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Faults{}, fmt.Errorf("%s=%q: want an integer", EnvSeed, s)
		}
		f.Seed = v
	}
	return f, nil
}

// dice rolls the faults. math/rand/v2's generators are not safe for
// concurrent use, hence the mutex; one seeded source for all rolls is what
// makes a seeded run repeat.
type dice struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func newDice(seed int64) *dice {
	s := uint64(seed)
	if seed == 0 {
		s = uint64(time.Now().UnixNano())
	}
	return &dice{rng: rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))}
}

// roll reports whether an event of probability rate happens. Rates of 0 and
// 1 are decided without drawing, so a fault that is off does not shift the
// sequence the others see.
func (d *dice) roll(rate float64) bool {
	switch {
	case rate <= 0:
		return false
	case rate >= 1:
		return true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rng.Float64() < rate
}
