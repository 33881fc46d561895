package bearer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/wire/bearer"
)

func TestToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header string
		want   string
		ok     bool
	}{
		{"Bearer ok_abc", "ok_abc", true},
		{"bearer ok_abc", "ok_abc", true},
		{"BEARER  ok_abc ", "ok_abc", true},
		{"", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Basic b2s6YWJj", "", false},
		{"ok_abc", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			t.Parallel()
			got, ok := bearer.Token(tt.header)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.want, got)
		})
	}
}
