package identity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// retryUnavailable runs attempt until it succeeds or fails otherwise than
// with the gateway's "unavailable" (it could not reach its storage: a
// leader election, a node restarting), waiting between attempts, longer
// each time, for at most about retryFor. Any other answer or failure is
// returned at once: a refusal is final, and a gateway that cannot be
// reached is the operator's to fix. A request sent again is safe: the
// gateway answers a repeated enrolment of the same key and token without
// spending a use (its first answer may have been lost).
func retryUnavailable(ctx context.Context, retryFor time.Duration, attempt func() error) error {
	deadline := time.Now().Add(retryFor)
	wait := 250 * time.Millisecond
	for n := 1; ; n++ {
		err := attempt()
		if err == nil || !unavailable(err) {
			return err
		}
		if time.Now().Add(wait).After(deadline) {
			if n > 1 {
				return fmt.Errorf("%w (asked %d times over %s)", err, n, retryFor.Round(time.Second))
			}
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// unavailable reports whether err is the gateway's answer that it cannot
// serve now.
func unavailable(err error) bool {
	var apiErr *protocol.APIError
	return errors.As(err, &apiErr) && apiErr.Code == protocol.APIUnavailable
}
