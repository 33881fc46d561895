package main

import (
	"strings"
	"testing"
)

func TestCellShowsTheWorstResultAndHowManyHadIt(t *testing.T) {
	rs := []result{
		{Check: "replay", Operation: "POST /a", Status: "pass"},
		{Check: "replay", Operation: "POST /b", Status: "fail"},
		{Check: "in-flight", Operation: "POST /a", Status: "skip"},
		{Check: "in-flight", Operation: "POST /b", Status: "error"},
		{Check: "canonical-json", Operation: "POST /a", Status: "error"},
		{Check: "canonical-json", Operation: "POST /b", Status: "fail"},
		{Check: "key-required", Operation: "POST /a", Status: "skip"},
		{Check: "key-required", Operation: "POST /b", Status: "skip"},
	}
	for check, want := range map[string]string{
		"replay": "fail 1/2", "in-flight": "error 1/2", "canonical-json": "fail 1/2", "key-required": "skip", "retry-after": "–",
	} {
		if got := cell(rs, check); got != want {
			t.Errorf("cell(%s) = %q, want %q", check, got, want)
		}
	}
}

// A finding under two profiles is one line when the reasons differ only
// in the ids the app made (and the sizes of answers holding them), and two when they differ in anything else (the
// status a profile wants).
func TestFindingsAreOneLineAcrossProfilesOnlyWhenTheSame(t *testing.T) {
	run := func(profile string, rs ...result) row { return row{App: "app", Profile: profile, results: rs} }
	rows := []row{
		run("oncekey",
			result{Check: "replay", Operation: "POST /a", Status: "fail", Reason: `got 201 {"id":"ord_2"}`},
			result{Check: "mismatch-request", Operation: "POST /a", Status: "fail", Reason: "got 417, want 409"},
			result{Check: "large-answer", Operation: "POST /a", Status: "fail", Reason: `the retry of a 1572933-byte answer: first "/a/ord_52"`}),
		run("ietf",
			result{Check: "replay", Operation: "POST /a", Status: "fail", Reason: `got 201 {"id":"ord_48"}`},
			result{Check: "mismatch-request", Operation: "POST /a", Status: "fail", Reason: "got 417, want 422"},
			result{Check: "large-answer", Operation: "POST /a", Status: "fail", Reason: `the retry of a 1572934-byte answer: first "/a/ord_103"`}),
	}
	md := string(markdown(rows, []string{"replay", "mismatch-request", "large-answer"}))
	for _, want := range []string{
		"- app `replay` fail on `POST /a` [oncekey, ietf]: got 201 {\"id\":\"ord_2\"}\n",
		"- app `mismatch-request` fail on `POST /a` [oncekey]: got 417, want 409\n",
		"- app `mismatch-request` fail on `POST /a` [ietf]: got 417, want 422\n",
		"- app `large-answer` fail on `POST /a` [oncekey, ietf]: the retry of a 1572933-byte answer: first \"/a/ord_52\"\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the findings lack %q:\n%s", want, md)
		}
	}
}

func TestShortenKeepsOneLineOfMarkdownText(t *testing.T) {
	got := shorten("got 409 <!DOCTYPE html>\n<pre>a|b</pre> `x`" + strings.Repeat("y", 300))
	if strings.ContainsAny(got, "\n<`") || strings.Contains(got, "a|b") {
		t.Errorf("shorten left a line break, a tag, a code span or a bare |: %q", got)
	}
	if n := len([]rune(got)); n != 200 {
		t.Errorf("shorten kept %d characters, want 200", n)
	}
}
