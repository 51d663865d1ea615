package controllers

import (
	"testing"

	migrationv1alpha1 "github.com/restow/restow/api/v1alpha1"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/migrator/quota"
)

// TestStalledReasons: the reasons the engine gives a stop are the API's
// condition reasons, so that the operator's Stalled condition and
// `kubectl restow run` name a stop alike (run once called every stop
// Unsupported, an API server lagging past --apiserver-lag-limit included).
func TestStalledReasons(t *testing.T) {
	for _, tc := range []struct {
		err  *migrator.StalledError
		want string
	}{
		{&migrator.StalledError{Message: "no such resource"}, migrationv1alpha1.UnsupportedReason},
		{&migrator.StalledError{Reason: migrator.ReasonAPIServerLagging, Message: "still at v1"}, migrationv1alpha1.APIServerLaggingReason},
		{&migrator.StalledError{Reason: quota.ReasonAlarm, Message: "NOSPACE"}, migrationv1alpha1.EtcdAlarmReason},
		{&migrator.StalledError{Reason: quota.ReasonQuota, Message: "no room"}, migrationv1alpha1.EtcdQuotaReason},
		{&migrator.StalledError{Reason: quota.ReasonNotCompacting, Message: "no compaction"}, migrationv1alpha1.EtcdNotCompactingReason},
		{&migrator.StalledError{Reason: quota.ReasonUnknown, Message: "no /metrics"}, migrationv1alpha1.EtcdSpaceUnknownReason},
	} {
		if got := tc.err.Why(); got != tc.want {
			t.Errorf("%q: Why() = %q, want %q", tc.err.Message, got, tc.want)
		}
	}
}
