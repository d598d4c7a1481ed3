// Package retry holds the two waits every retry loop of idemstream shares:
// a backoff that doubles between a floor and a ceiling, and a sleep that
// ends early with its context.
//
//	wait := retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
//	for {
//		if err := try(); err == nil || !dedupe.IsRetryable(err) {
//			return err
//		}
//		if err := retry.Sleep(ctx, wait.Next()); err != nil {
//			return err // ctx ended
//		}
//	}
package retry
