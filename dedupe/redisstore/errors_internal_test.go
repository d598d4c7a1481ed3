package redisstore

import (
	"errors"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
)

// serverError is an answer of the server, as go-redis hands it over.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

// What an operator must act on stops the pipeline; what passes by itself
// pauses it. The words of a refusal inside a script differ by release.
func TestClassifyServerAnswers(t *testing.T) {
	for _, tc := range []struct {
		answer string
		final  bool
	}{
		{"NOPERM this user has no permissions to run the 'set' command", true},
		{"ERR The user executing the script can't run this command or subcommand script: 00464dea, on @user_script:11.", true},
		{"ERR ACL failure in script: User 'nowrite' has no permissions to run the 'set' command script: 00464dea, on @user_script:11.", true},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", true},
		{"OOM command not allowed when used memory > 'maxmemory'.", false},
		{"READONLY You can't write against a read only replica.", false},
		{"LOADING Redis is loading the dataset in memory", false},
	} {
		err := classify("complete", serverError(tc.answer))
		if paused := errors.Is(err, dedupe.ErrStoreUnavailable); paused == tc.final {
			t.Errorf("%q: %v; want final %v", tc.answer, err, tc.final)
		}
	}
}
