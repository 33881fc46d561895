package provider_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/provider"
)

func TestFaultsFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		want    provider.Faults
		wantErr string
	}{
		{name: "nothing set is no faults", env: nil, want: provider.Faults{}},
		{name: "empty values are unset", env: map[string]string{provider.EnvFailRate: "", provider.EnvLatency: " "}, want: provider.Faults{}},
		{name: "everything", env: map[string]string{
			"FAKEPROVIDER_FAIL_RATE":    "0.1",
			"FAKEPROVIDER_TIMEOUT_RATE": "0.25",
			"FAKEPROVIDER_TIMEOUT_HOLD": "2s",
			"FAKEPROVIDER_LATENCY":      " 150ms ",
			"FAKEPROVIDER_DECLINE_RATE": "1",
			"FAKEPROVIDER_SEED":         "-7",
		}, want: provider.Faults{FailRate: 0.1, TimeoutRate: 0.25, TimeoutHold: 2 * time.Second,
			Latency: 150 * time.Millisecond, DeclineRate: 1, Seed: -7}},
		{name: "rate not a number", env: map[string]string{"FAKEPROVIDER_FAIL_RATE": "ten percent"}, wantErr: `FAKEPROVIDER_FAIL_RATE="ten percent"`},
		{name: "rate above one", env: map[string]string{"FAKEPROVIDER_TIMEOUT_RATE": "1.5"}, wantErr: "FAKEPROVIDER_TIMEOUT_RATE"},
		{name: "negative rate", env: map[string]string{"FAKEPROVIDER_DECLINE_RATE": "-0.1"}, wantErr: "FAKEPROVIDER_DECLINE_RATE"},
		{name: "NaN rate", env: map[string]string{"FAKEPROVIDER_FAIL_RATE": "NaN"}, wantErr: "FAKEPROVIDER_FAIL_RATE"},
		{name: "duration without a unit", env: map[string]string{"FAKEPROVIDER_LATENCY": "100"}, wantErr: "FAKEPROVIDER_LATENCY"},
		{name: "negative duration", env: map[string]string{"FAKEPROVIDER_TIMEOUT_HOLD": "-1s"}, wantErr: "FAKEPROVIDER_TIMEOUT_HOLD"},
		{name: "seed not an integer", env: map[string]string{"FAKEPROVIDER_SEED": "1.5"}, wantErr: "FAKEPROVIDER_SEED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := provider.FaultsFromEnv(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			require.NoError(t, got.Validate(), "what FaultsFromEnv accepts, NewServer accepts")
		})
	}
}

func TestFaultsValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		faults  provider.Faults
		wantErr string
	}{
		{"zero", provider.Faults{}, ""},
		{"all at the bounds", provider.Faults{FailRate: 1, TimeoutRate: 1, DeclineRate: 0}, ""},
		{"fail rate", provider.Faults{FailRate: 1.01}, "fail rate"},
		{"timeout rate", provider.Faults{TimeoutRate: -1}, "timeout rate"},
		{"decline rate", provider.Faults{DeclineRate: 2}, "decline rate"},
		{"hold", provider.Faults{TimeoutHold: -time.Second}, "timeout hold"},
		{"latency", provider.Faults{Latency: -time.Second}, "latency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.faults.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}
