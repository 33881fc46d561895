// What the tests check of a thrown problem, shared by the scripted and the
// live tests.
import assert from "node:assert/strict";
import { OncekeyProblemError } from "../dist/index.js";

export const PROBLEMS = "https://oncekey.dev/problems/";

/** An assert.rejects validator: the error is an OncekeyProblemError of status and type (its slug). */
export function isProblem(status: number, type: string) {
  return (err: unknown) => {
    assert.ok(err instanceof OncekeyProblemError, String(err));
    assert.equal(err.status, status);
    assert.equal(err.problem.type, `${PROBLEMS}${type}`);
    assert.equal(err.problem.status, status);
    return true;
  };
}
