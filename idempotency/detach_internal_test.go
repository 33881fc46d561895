package idempotency

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// detachKey is a context key of TestDetach's.
type detachKey struct{}

// TestDetach: a detached context behaves as
// context.WithDeadline(context.WithoutCancel(ctx), deadline), whether its
// timer was started or not.
func TestDetach(t *testing.T) {
	t.Parallel()
	parent := func() (context.Context, context.CancelFunc) {
		return context.WithCancel(context.WithValue(context.Background(), detachKey{}, "v"))
	}

	t.Run("keeps values and deadline, not cancellation", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := parent()
		d := detach(ctx)
		defer d.cancel()
		cancel()
		require.Equal(t, "v", d.Value(detachKey{}))
		deadline, ok := d.Deadline()
		require.True(t, ok)
		require.WithinDuration(t, time.Now().Add(detachedFor), deadline, time.Second)
		require.NoError(t, d.Err())
		require.NoError(t, context.Cause(d))
		select {
		case <-d.Done():
			t.Fatal("done with its parent")
		default:
		}
		require.NoError(t, d.Err())
		require.Equal(t, "v", d.Value(detachKey{}))
	})

	t.Run("the parent's earlier deadline", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		d := detach(ctx)
		defer d.cancel()
		want, _ := ctx.Deadline()
		got, _ := d.Deadline()
		require.Equal(t, want, got)
		<-d.Done()
		require.ErrorIs(t, d.Err(), context.DeadlineExceeded)
	})

	t.Run("past its deadline without a timer", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		d := detach(ctx)
		defer d.cancel()
		require.ErrorIs(t, d.Err(), context.DeadlineExceeded)
		select {
		case <-d.Done():
		default:
			t.Fatal("Err is set and Done open")
		}
	})

	t.Run("cancel ends it, before or after Done", func(t *testing.T) {
		t.Parallel()
		for _, early := range []bool{true, false} {
			ctx, cancel := parent()
			defer cancel()
			d := detach(ctx)
			if early {
				_ = d.Done()
			}
			d.cancel()
			<-d.Done()
			require.ErrorIs(t, d.Err(), context.Canceled)
			d.cancel()
		}
	})

	t.Run("derived contexts end with it", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := parent()
		defer cancel()
		d := detach(ctx)
		child, stop := context.WithCancel(d)
		defer stop()
		ran := make(chan struct{})
		context.AfterFunc(d, func() { close(ran) })
		require.Equal(t, "v", child.Value(detachKey{}))
		d.cancel()
		<-child.Done()
		<-ran
		require.True(t, errors.Is(child.Err(), context.Canceled))
		require.ErrorIs(t, context.Cause(child), context.Canceled)
	})
}
